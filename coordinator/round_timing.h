/* round_timing.h: the wall-time measurements of rounds, and what they
 * teach: how long a round waited for its draft, the target's idle gaps
 * between verifications, the target's forward-call cost fitted over its
 * calls (adaptive K under load), and each finished round's costs handed to
 * the sequence's K controller (docs/adaptive-k.md). It measures and
 * decides nothing: the scheduler calls it at each step of a round. It owns
 * the round's times (struct round_times, round.h) and only reads the rest
 * of the record.
 */
#ifndef TANDEM_ROUND_TIMING_H
#define TANDEM_ROUND_TIMING_H

#include <stdbool.h>

#include "coord_state.h"

/* A verification of k drafts goes out for s now (k = 0: plain steps or the
 * prefill): the round's wait for its draft ends here unless it went beside
 * its draft, and the target's idle gap since its last reply is counted. */
void round_timing_verify_sent(struct coordinator *c, struct seq *s, int k, bool beside_draft);

/* s's fresh draft call (s->round.draft) goes out now; with_prefill: the
 * draft still prefills the prompt, so its cost says nothing of drafting. */
void round_timing_draft_sent(struct seq *s, bool with_prefill);

/* The prefill goes out: a first verification, but not a round (no gap). */
void round_timing_prefill_sent(struct coordinator *c, struct seq *s);

/* Accounts the time s's round waited for its draft, up to until_ms (the
 * stats' draft_wait). */
void round_timing_draft_wait(struct coordinator *c, const struct seq *s, double until_ms);

/* A draft reply for s (fresh or pre-draft, used or not) says the draft
 * computed draft_ms (< 0: not given): the stats' draft time. */
void round_timing_draft_compute(struct coordinator *c, struct seq *s, double draft_ms);

/* The fresh draft of s's round (k drafts) arrived now; draft_ms is the
 * worker's own figure (< 0: not given). Sets what the controller will be
 * charged for drafting. */
void round_timing_draft_ready(struct seq *s, int k, double draft_ms);

/* A pre-draft is verified at once: the controller is charged only the
 * drafting the target waited for since its last reply. */
void round_timing_predraft_used(struct seq *s);

/* A verification's reply m for s (in the state that awaited it) arrived
 * now: notes the target's call (its cost fit), idle and compute time; past
 * the prefill, counts the round in the request's and the coordinator's
 * figures (by draft source) and teaches the K controller the round of the
 * draft model. The round's wall time runs from the previous reply to this
 * one (the prefill's reply starts the first round). */
void round_timing_verify_done(struct coordinator *c, struct seq *s, const struct worker_msg_verify_done *m,
                              double now);

/* A plain run's next step starts at the target now (it goes on by itself). */
void round_timing_step_sent(struct seq *s, double now);

#endif
