/* worker_msg.h: the messages between the coordinator and the workers, typed.
 *
 * One struct per message type, one encoder and one decoder each, used by both
 * ends: the coordinator encodes commands and decodes replies, the workers the
 * other way round, so the two sides cannot drift apart field by field.
 * docs/protocol-notes.md describes the exchange; this file is its code.
 *
 * Encoders return a new header (owned by the caller, who sends it with
 * protocol_send or worker_link_send, which delete it) or NULL when out of
 * memory, and fill at most one token frame that borrows the struct's array.
 * Decoders validate every field (type, range against the limits, frame
 * sizes) and return 0 or ERR_PROTOCOL with "field: ..." in err. Fields are
 * read in declaration order; on failure the ones read so far are set and
 * req/slot keep -1 until read, so the caller can still name the request in
 * its error reply. Token arrays in decoded structs point into the received
 * message (valid until protocol_msg_free); a decoded shm descriptor points
 * into its header.
 *
 * What it is not: it decides nothing (which request a reply belongs to,
 * whether a round is stale); the coordinator's scheduler and the worker
 * roles do.
 */
#ifndef TANDEM_WORKER_MSG_H
#define TANDEM_WORKER_MSG_H

#include <stdbool.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "cpulist.h"
#include "protocol.h"
#include "sampling.h"
#include "speculate.h"
#include "speculate_tree.h"

/* Largest integer a JSON number carries exactly (2^53): the range of "req"
 * and "seed". */
#define WORKER_MSG_JSON_INT_MAX 9007199254740992LL
/* Most EOS ids a register may list. */
#define WORKER_MSG_SHM_DOMAIN_MAX 128
#define WORKER_MSG_EOS_MAX 8
#define WORKER_MSG_NAME_MAX 1024

/* What a decoder checks ranges against. */
struct worker_msg_limits {
    int n_slots;     /* slot in 0..n_slots-1 */
    int max_seq_len; /* keep_len and token frames */
    int k_max;       /* drafts per round (at most SPECULATE_K_MAX) */
    int vocab_size;  /* token ids in replies; 0: not checked */
};

/* Request identity every command and reply carries. */
struct worker_msg_seq {
    int64_t req; /* 0..2^53; -1 until decoded */
    int slot;    /* -1 until decoded */
};

/* sampling {temperature, top_k, top_p, min_p, seed, presence_penalty?,
 * frequency_penalty?, repetition_penalty?, logit_bias?} and mode. The
 * controls (sampling.h) travel only when set; logit_bias as [[id, bias],
 * ...]. */
struct worker_msg_sampling {
    struct sampling_params sp;
    enum speculate_mode mode;
    struct sampling_controls ctl;
};

/* The client's logprobs, asked of a target command (false when absent):
 * "logprobs": N asks for each emitted token's and the N
 * (0..SAMPLING_TOP_LOGPROBS_MAX) most likely tokens' raw log-probabilities
 * in verify_done. */
struct worker_msg_logprobs {
    bool on;
    int top;
};

/* prefill (coordinator -> draft or target) + frame prompt: the slot starts
 * over with the prompt. The draft fills its cache (prefill_done); the
 * target also chooses the first token (verify_done of `round`). */
struct worker_msg_prefill {
    struct worker_msg_seq seq;
    struct worker_msg_sampling sampling;
    const int32_t *prompt;
    int n_prompt;
    int64_t round;                 /* the target's: its verify_done names it (0 when absent) */
    struct worker_msg_logprobs logprobs; /* the target's */
    /* The request's grammar (optional, borrowed; grammar_spec.h's wire
     * form): both workers mask the slot's rows with it until its next
     * prompt. */
    const cJSON *grammar;
};

/* What a worker's prefix cache did for a prompt (optional object "prefix"
 * of prefill_done and of the verify_done that ends a prompt's first
 * verification), and where its cache stands. */
struct worker_msg_prefix {
    bool present;
    int looked_up;      /* prompt tokens looked up */
    int cached;         /* of them, found in the cache (not computed) */
    int cached_blocks;  /* blocks kept that no sequence holds */
    int64_t evictions;  /* cached blocks taken back, since the worker started */
};

/* prefill_done (draft -> coordinator). */
struct worker_msg_prefill_done {
    struct worker_msg_seq seq;
    double prefill_ms;
    struct worker_msg_prefix prefix;
};

/* draft (coordinator -> draft) + frame feed. */
struct worker_msg_draft {
    struct worker_msg_seq seq;
    int half;
    int64_t round;
    int keep_len;
    int k;
    int predraft_k; /* optional: 0 */
    struct worker_msg_sampling sampling;
    const int32_t *feed;
    int n_feed;
};

/* draft_ready (draft -> coordinator). */
struct worker_msg_draft_ready {
    struct worker_msg_seq seq;
    int half;
    int64_t round;
    int k;
    int guess;       /* the pre-draft's bonus guess, -1 for none */
    bool predraft;
    double draft_ms; /* -1: not measured */
};

/* What the target's commands after the prompt share: the slot keeps
 * keep_len positions, then the feed runs (with the drafts, if any), and the
 * tokens chosen come back in verify_done(s) naming `round`. */
struct worker_msg_target_call {
    struct worker_msg_seq seq;
    int64_t round;
    int keep_len;
    struct worker_msg_sampling sampling;
    const int32_t *feed;
    int n_feed;
    struct worker_msg_logprobs logprobs;
};

/* run (coordinator -> target) + frame feed: plain decoding, no drafts.
 * After the first step each feeds the token the one before it chose, and
 * each answers with a verify_done of its own (its "step"), so a run of
 * plain rounds crosses the coordinator once instead of once a token. The
 * target stops early after an end-of-sequence token; a release ends the
 * run. */
struct worker_msg_run {
    struct worker_msg_target_call call;
    int steps;         /* 1..WORKER_MSG_STEPS_MAX; 1 when absent */
};

/* verify_matched (coordinator -> target) + frame feed: drafts the
 * coordinator made (an n-gram or suffix-cache match), carried in the
 * message instead of the draft's buffer, verified as point masses (no q
 * rows exist). */
struct worker_msg_verify_matched {
    struct worker_msg_target_call call;
    int32_t drafts[SPECULATE_K_MAX];
    int n_drafts;      /* 1..k_max */
};

/* Most nodes of a verify_tree: with the last token (its root) a tree
 * forward holds SPECULATE_TREE_NODES_MAX rows, the model's tree limit. */
#define WORKER_MSG_TREE_NODES_MAX (SPECULATE_TREE_NODES_MAX - 1)

/* verify_tree (coordinator -> target) + frame feed: a token tree the
 * coordinator made (suffix-cache or n-gram continuations merged under the
 * last fed token, draft_tree.h), verified in one forward as point masses.
 * Node i holds drafts[i] under parents[i] (-1: a child of the last fed
 * token, else an earlier node), so a root path is never deeper than k_max:
 * verify_done's tokens are the accepted path then the target's next, as a
 * chain's. */
struct worker_msg_verify_tree {
    struct worker_msg_target_call call;
    int32_t drafts[WORKER_MSG_TREE_NODES_MAX];
    int32_t parents[WORKER_MSG_TREE_NODES_MAX];
    int n_nodes;       /* 1..WORKER_MSG_TREE_NODES_MAX */
};

/* verify (coordinator -> target) + frame feed [+ frame half]: the k drafts
 * (and q rows) the draft published in its buffer's half for this round. */
struct worker_msg_verify {
    struct worker_msg_target_call call;
    int k;             /* 1..k_max */
    int half;
    const cJSON *shm;  /* optional draft buffer descriptor (borrowed) */
    /* Sent beside its draft (false when absent): the half may not hold the
     * round yet, and the target waits for the draft to publish it
     * (shm_buffer_half_wait) instead of refusing the verify, so the round
     * skips the trip of draft_ready through the coordinator. A draft that
     * does not publish in time fails it with "timeout". */
    bool await_draft;
};

/* Most plain steps one run may ask for. */
#define WORKER_MSG_STEPS_MAX 256

/* verify_done (target -> coordinator) + frame tokens (n_accepted + 1). */
struct worker_msg_verify_done {
    struct worker_msg_seq seq;
    int64_t round;
    int n_accepted;
    double verify_ms;
    double idle_ms;    /* -1: unknown (first verification) */
    int draft_k;       /* drafts verified: a chain's k, a tree's nodes (0..WORKER_MSG_TREE_NODES_MAX) */
    int step;          /* which of the verify's steps this answers (1 when absent) */
    const int32_t *tokens;
    int n_tokens;
    /* The target's forward call that finished this verification (batching):
     * its number (counting from 1; 0: not reported), how many sequences and
     * rows it held. One call can finish several verifications. */
    int64_t call;
    int call_seqs, call_rows;
    double call_ms;
    struct worker_msg_prefix prefix;
    /* "logprobs" (absent unless the verify asked): one entry per token,
     * [logprob, id, logprob, id, logprob, ...], the token's then its row's
     * top tokens', floats printed exactly (17 digits). */
    bool has_logprobs;
    struct sampling_logprobs logprobs[SPECULATE_K_MAX + 1];
};

/* error (worker -> coordinator). */
struct worker_msg_error {
    struct worker_msg_seq seq;  /* -1 when the command was unreadable */
    const char *code;           /* lower-case error_name */
    const char *message;
    const char *in_reply_to;    /* the command type */
};

/* The cores a CPU-backend worker computes on ("cpu" in register; absent
 * from a GPU worker, whose host thread only feeds its device). The
 * coordinator compares the draft's and the target's to learn whether the
 * two compete for cores (cpulist_oversubscribed). */
#define WORKER_MSG_CPU_HOST_MAX 64
#define WORKER_MSG_CPU_LIST_MAX 4096
struct worker_msg_cpu {
    bool present;
    const char *host;           /* the kernel's boot id: processes on one kernel share its cores */
    int threads;                /* compute threads */
    const char *cpus;           /* the CPUs they may run on, in list notation ("0-3,8") */
    struct cpulist set;         /* decode: cpus parsed (the encoder reads cpus only) */
};

/* register (worker -> coordinator). */
struct worker_msg_register {
    const char *role;           /* "draft" | "target" */
    int pid;
    const char *model;
    const char *backend;
    int vocab_size;
    int32_t eos_ids[WORKER_MSG_EOS_MAX];
    int n_eos;
    int max_seq_len;
    int n_slots;
    int bos_id;                 /* -1: none */
    int kv_blocks;              /* the paged KV pool: blocks shared by all slots */
    int kv_block_size;          /* positions per block (0 with kv_blocks 0: not reported,
                                   every slot can reach max_seq_len) */
    const cJSON *shm;           /* the draft's buffer descriptor (required from a draft) */
    int drops;                  /* connection drops the worker has seen (0 when absent); each
                                   emptied its slots (worker_link.h), so a registration
                                   differing only in drops holds none of the old sequences */
    struct worker_msg_cpu cpu;
    int pair;                   /* the draft/target pair it serves (proc_config "pairs"), 0 when
                                   absent */
    const char *shm_domain;     /* where its POSIX shared memory lives: "<boot id>:<dev>:<inode>"
                                   of /dev/shm; two workers whose domains differ share none
                                   (other hosts, containers): the draft's halves then travel in
                                   messages ("" when absent or unknown) */
};

cJSON *worker_msg_prefill_encode(const struct worker_msg_prefill *m, struct protocol_frame *frame);
int worker_msg_prefill_decode(const struct protocol_msg *msg, const struct worker_msg_limits *lim,
                              struct worker_msg_prefill *m, char *err);

cJSON *worker_msg_prefill_done_encode(const struct worker_msg_prefill_done *m);
int worker_msg_prefill_done_decode(const struct protocol_msg *msg,
                                   const struct worker_msg_limits *lim,
                                   struct worker_msg_prefill_done *m, char *err);

cJSON *worker_msg_draft_encode(const struct worker_msg_draft *m, struct protocol_frame *frame);
int worker_msg_draft_decode(const struct protocol_msg *msg, const struct worker_msg_limits *lim,
                            struct worker_msg_draft *m, char *err);

cJSON *worker_msg_draft_ready_encode(const struct worker_msg_draft_ready *m);
/* k in 0..SPECULATE_K_MAX + 1 (a pre-draft holds its guess too); the
 * scheduler checks it against what it asked for. */
int worker_msg_draft_ready_decode(const struct protocol_msg *msg,
                                  const struct worker_msg_limits *lim,
                                  struct worker_msg_draft_ready *m, char *err);

cJSON *worker_msg_run_encode(const struct worker_msg_run *m, struct protocol_frame *frame);
int worker_msg_run_decode(const struct protocol_msg *msg, const struct worker_msg_limits *lim,
                          struct worker_msg_run *m, char *err);

cJSON *worker_msg_verify_matched_encode(const struct worker_msg_verify_matched *m,
                                        struct protocol_frame *frame);
/* Each draft a vocabulary id (when lim->vocab_size > 0). */
int worker_msg_verify_matched_decode(const struct protocol_msg *msg, const struct worker_msg_limits *lim,
                                     struct worker_msg_verify_matched *m, char *err);

cJSON *worker_msg_verify_tree_encode(const struct worker_msg_verify_tree *m,
                                     struct protocol_frame *frame);
/* Refused by name: drafts and parents of different lengths, more than
 * WORKER_MSG_TREE_NODES_MAX nodes, a parent out of range (below -1 or past
 * the nodes), a parent not before its child, a node deeper than k_max, a
 * draft outside the vocabulary (when lim->vocab_size > 0). */
int worker_msg_verify_tree_decode(const struct protocol_msg *msg, const struct worker_msg_limits *lim,
                                  struct worker_msg_verify_tree *m, char *err);

/* shm (borrowed) is duplicated into the header. A half's bytes, when they
 * travel (docs/scale-out.md), are the sender's second frame. */
cJSON *worker_msg_verify_encode(const struct worker_msg_verify *m, struct protocol_frame *frame);
int worker_msg_verify_decode(const struct protocol_msg *msg, const struct worker_msg_limits *lim,
                             struct worker_msg_verify *m, char *err);

cJSON *worker_msg_verify_done_encode(const struct worker_msg_verify_done *m,
                                     struct protocol_frame *frame);
/* Checks n_accepted in 0..SPECULATE_K_MAX (the scheduler then checks it
 * against the round's k), n_accepted + 1 tokens, each a vocabulary id
 * (when lim->vocab_size > 0). */
int worker_msg_verify_done_decode(const struct protocol_msg *msg,
                                  const struct worker_msg_limits *lim,
                                  struct worker_msg_verify_done *m, char *err);

/* release {req, slot}: no frame. */
cJSON *worker_msg_release_encode(const struct worker_msg_seq *m);
int worker_msg_release_decode(const struct protocol_msg *msg, const struct worker_msg_limits *lim,
                              struct worker_msg_seq *m, char *err);

/* code: an error.h code, sent as its lower-case name. */
cJSON *worker_msg_error_encode(const struct worker_msg_seq *seq, int code, const char *message,
                               const char *in_reply_to);
/* Lenient by design: an error reply is read even when parts of it are
 * missing (code and message default to ""); only req/slot are checked, and
 * left at -1 when absent or out of range. */
void worker_msg_error_decode(const struct protocol_msg *msg, const struct worker_msg_limits *lim,
                             struct worker_msg_error *m);

/* shm (borrowed) is duplicated into the header when not NULL. */
cJSON *worker_msg_register_encode(const struct worker_msg_register *m);
/* Strings borrow the header. A draft without shm is refused. */
int worker_msg_register_decode(const struct protocol_msg *msg, struct worker_msg_register *m,
                               char *err);

#endif
