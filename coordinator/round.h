/* round.h: a sequence's speculation round as a record of its own: the
 * state it waits in, what each call in flight carries (a payload per
 * call), the pre-draft beside it, and round timing's part.
 *
 * The state moves only through round_move, which checks the event against
 * the table of legal transitions (round.c). The scheduler decides which
 * event happened; a transition the table does not allow is a bug in the
 * scheduler, and round_move refuses it (the state is left as it was) so
 * the caller can fail that request instead of computing on a round in a
 * state nothing expects.
 *
 * Round states, per active sequence (what it waits for):
 *   IDLE -> PREFILLING                 prefill_sent: the target's prefill goes out
 *   PREFILLING -> IDLE                 target_done: the prefill's reply (its token accepted)
 *   IDLE -> DRAFTING                   draft_sent: a fresh draft (K >= 1)
 *   DRAFTING -> VERIFY_BESIDE_DRAFT    verify_beside_sent: its verification goes beside it
 *   IDLE -> VERIFYING                  verify_sent: a ready pre-draft whose guess is the bonus,
 *                                      or drafts matched here (n-gram, suffix cache)
 *   DRAFTING -> VERIFYING              verify_sent: draft_ready
 *   VERIFY_BESIDE_DRAFT -> VERIFYING   verify_sent: the target gave up waiting, the draft was
 *                                      in: verified again the usual way
 *   IDLE -> PLAIN_RUN                  run_sent: K = 0, no draft, or no match: plain steps
 *   PLAIN_RUN -> PLAIN_RUN             step_done: a step answered, more to come
 *   DRAFTING -> IDLE                   draft_lost: the draft failed or was lost
 *   VERIFYING, VERIFY_BESIDE_DRAFT,
 *   PLAIN_RUN -> IDLE                  target_done (a plain run: its last step)
 *   VERIFYING, VERIFY_BESIDE_DRAFT
 *     -> AWAIT_PREDRAFT                predraft_awaited: every draft accepted, the
 *                                      pre-draft not back yet
 *   VERIFY_BESIDE_DRAFT -> DRAFTING    target_gave_up: the draft not in yet
 *   VERIFY_BESIDE_DRAFT -> IDLE        beside_abandoned: gave up, and the draft is lost
 *   AWAIT_PREDRAFT -> IDLE             predraft_resolved (used or not), draft_lost
 *   any -> (freed)                     the end of the sequence, a failure, a cancel: the
 *                                      record is cleared, not moved
 * IDLE lasts no longer than a scheduler call: the next round is decided at
 * once.
 */
#ifndef TANDEM_ROUND_H
#define TANDEM_ROUND_H

#include <stdbool.h>
#include <stdint.h>

#include "request.h"

enum round_state {
    ROUND_IDLE = 0,            /* waits for nothing: the next round is decided at once */
    ROUND_PREFILLING,          /* the target's prefill (a verification of k = 0, the prompt as feed) */
    ROUND_DRAFTING,            /* a fresh draft asked for: its draft_ready sends the verification */
    ROUND_VERIFYING,           /* a verification of k >= 1 drafts, fresh, pre-drafted or matched */
    ROUND_VERIFY_BESIDE_DRAFT, /* a verification sent with its draft (verify "await_draft"): its
                                * reply and the draft's come in either order */
    ROUND_AWAIT_PREDRAFT,      /* every draft accepted: the pre-draft on its way decides the next round */
    ROUND_PLAIN_RUN,           /* k = 0: a run of plain steps (a "run" with "steps"), each answered */
};
#define ROUND_STATES 7

enum round_event {
    ROUND_PREFILL_SENT = 0,
    ROUND_DRAFT_SENT,
    ROUND_VERIFY_BESIDE_SENT,
    ROUND_VERIFY_SENT,
    ROUND_RUN_SENT,
    ROUND_STEP_DONE,
    ROUND_TARGET_DONE,
    ROUND_PREDRAFT_AWAITED,
    ROUND_PREDRAFT_RESOLVED,
    ROUND_DRAFT_LOST,
    ROUND_TARGET_GAVE_UP,
    ROUND_BESIDE_ABANDONED,
};
#define ROUND_EVENTS 12

/* VERIFY_BESIDE_DRAFT's payload: what became of the draft the target waits on. */
enum beside_draft {
    BESIDE_DRAFT_AWAITED = 0,
    BESIDE_DRAFT_IN,           /* its draft_ready came: the round's draft is in half 0 */
    BESIDE_DRAFT_LOST,         /* it failed or the draft was lost: never to be verified */
};

/* The pre-draft the draft worker makes beside a verification: the next
 * round's drafts, on the guess that every draft of this one is accepted. */
enum predraft_state {
    PREDRAFT_NONE = 0,         /* none asked for, used, or back unusable */
    PREDRAFT_PENDING,          /* asked for with the round's draft, its reply not back */
    PREDRAFT_READY,            /* back with a guess and drafts: used if the guess is the bonus */
    PREDRAFT_ABANDONED,        /* its round did not accept every draft: still being made, never used */
};

/* The verification in flight: valid while the target is awaited
 * (PREFILLING, VERIFYING, VERIFY_BESIDE_DRAFT, PLAIN_RUN). */
struct round_verify {
    int round;               /* the round number its reply must carry */
    int k;                   /* drafts verified (0: the prefill or plain steps) */
    int L;                   /* the history's length when it went out */
    int cached;              /* of its drafts, those the draft's cache holds once accepted */
    int keep, feed;          /* the target's cache kept, and the tokens fed after it */
    int steps, done;         /* PLAIN_RUN: steps asked for, answered (1 and 0..1 otherwise) */
    /* where its drafts came from: an n-gram or suffix-cache match travels
     * in the message (verify "drafts"), not in the draft's buffer */
    enum request_draft source;
    bool tree;               /* its k drafts went as a token tree (verify_tree): k nodes */
    enum beside_draft beside; /* VERIFY_BESIDE_DRAFT */
};

/* The fresh draft call in flight: valid while DRAFTING or
 * VERIFY_BESIDE_DRAFT. */
struct round_draft {
    int round, k, predraft_k;
    int n_feed;              /* tokens the draft call catches up on */
};

/* The pre-draft beside the round, in any state. */
struct round_predraft {
    enum predraft_state state;
    int round, k, half;
    int32_t guess;           /* READY: the bonus token it guessed */
    int32_t bonus;           /* AWAIT_PREDRAFT: the round's bonus token (in the history) */
};

/* round_timing.c's part: what it measures for the K controller and the
 * stats. The round as the request experiences it starts when the previous
 * verification's reply arrives (or the prefill's) and ends with this
 * one's; the target waits for the draft from the start until the
 * verification is sent. No other module writes it. */
struct round_times {
    double verify_sent_ms;
    double draft_sent_ms;
    double last_draft_ms;    /* the draft's cost the controller is charged for the round */
    double verify_done_ms;   /* when the target last finished a verification of this sequence */
    double start_ms;
    double draft_ready_ms;   /* when the fresh draft of the round arrived (< 0: none) */
    double last_draft_raw_ms; /* the draft's compute for the round, catch-up included */
    bool plain_alone;        /* the verification in flight ran with no pre-draft beside it */
    bool predrafted;         /* the round's draft asked for a pre-draft (or is one) */
    bool with_prefill;       /* the round's draft was queued while the draft prefilled */
};

struct round {
    enum round_state state;
    int counter;             /* the last round number given out */
    struct round_verify verify;
    struct round_draft draft;
    struct round_predraft predraft;
    struct round_times times;
};

/* Whether the table allows event ev in state from; *to: the state it
 * leads to (when allowed). */
bool round_allows(enum round_state from, enum round_event ev, enum round_state *to);

/* Moves r by ev: 0, or -1 when the table does not allow ev in r's state
 * (r unchanged; err, when not NULL, says which transition was refused). */
int round_move(struct round *r, enum round_event ev, char *err);

/* Whether r awaits the target's reply to a verification (or the prefill). */
bool round_awaits_target(const struct round *r);

/* Whether r awaits its fresh draft's draft_ready. */
bool round_awaits_draft(const struct round *r);

const char *round_state_name(enum round_state s);
const char *round_event_name(enum round_event ev);

#endif
