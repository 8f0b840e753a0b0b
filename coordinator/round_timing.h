/* round_timing.h: the wall-time measurements of rounds, and what they
 * teach: how long a round waited for its draft, the target's idle gaps
 * between verifications, the target's forward-call cost fitted over its
 * calls (adaptive K under load), and each finished round's costs handed to
 * the sequence's K controller (docs/adaptive-k.md). It measures and
 * decides nothing: the scheduler calls it at each step of a round.
 */
#ifndef TANDEM_ROUND_TIMING_H
#define TANDEM_ROUND_TIMING_H

#include <stdbool.h>

#include "coord_state.h"

/* A verification of k drafts goes out for s now (k = 0: plain steps or the
 * prefill): the round's wait for its draft ends here unless it went beside
 * its draft, and the target's idle gap since its last reply is counted. */
void round_timing_verify_sent(struct coordinator *c, struct seq *s, int k, bool beside_draft);

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

/* A verification's reply for s arrived now: notes the target's call (its
 * cost fit), idle and compute time. Returns the round's wall time, from the
 * previous reply to this one; < 0 for the prefill's reply (prefill true),
 * which starts the first round. */
double round_timing_verify_done(struct coordinator *c, struct seq *s, const struct worker_msg_verify_done *m,
                                bool prefill, double now);

/* Teaches s's K controller the round just verified: k drafts, n_acc
 * accepted, n_tok tokens; beside: it went out beside its draft, and
 * draft_unknown: its reply came before the draft's (the draft's cost is
 * then unknown, and the wait for it ends now). */
void round_timing_learn(struct coordinator *c, struct seq *s, const struct worker_msg_verify_done *m, int k,
                        double round_wall_ms, bool beside, bool draft_unknown, double now);

/* Counts a verified round of k drafts, n_acc accepted, in the request's and
 * the coordinator's figures (by draft source). */
void round_timing_count(struct coordinator *c, struct seq *s, int k, int n_acc);

#endif
