/* coord_state.h: the state every module of the coordinator shares: the
 * worker records, the sequence records and the coordinator itself.
 *
 * Private to coordinator/: no other room includes it. Each module owns a
 * part of these records (the opening comment of each .c file says which;
 * docs/architecture.md, "The coordinator, by job", lists them all).
 * Single-threaded: every function runs on the thread of coordinator_run.
 */
#ifndef TANDEM_COORD_STATE_H
#define TANDEM_COORD_STATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "adaptive_k.h"
#include "connections.h"
#include "cpulist.h"
#include "lane.h"
#include "metrics.h"
#include "ngram.h"
#include "output.h"
#include "proc_config.h"
#include "protocol.h"
#include "request.h"
#include "round.h"
#include "sampling.h"
#include "speculate.h"
#include "suffix_cache.h"
#include "tokenizer.h"
#include "tree_choice.h"
#include "logprobs.h"
#include "worker_msg.h"

#define COORD_EOS_MAX WORKER_MSG_EOS_MAX
#define COORD_HALF_FRESH 0
#define COORD_HALF_PREDRAFT 1
#define COORD_DRAFT_ERRORS_MAX 3
/* Hard cap on one frame of a client message (ZMQ_MAXMSGSIZE) as a multiple
 * of max_message_bytes: between the two the client gets an error reply
 * (with its id when the frame's top-level "id" can be read), past it ZeroMQ
 * drops the connection before buffering the frame. A frame below the cap is
 * held whole in memory before we see it, so the cap bounds what a burst of
 * clients can make the coordinator hold: 2 keeps a helpful "too large"
 * reply for a message somewhat over the limit without letting 16 clients
 * park 16 x 16 MiB. Nothing bounds a message of many frames: libzmq holds
 * a multipart message whole before it delivers its first frame, and its
 * limit is per frame (150 frames of 1.9 MB: a 286 MiB peak). Intake keeps a
 * copy of the first non-empty frame only and gives the rest back at once
 * (malloc_trim below), so memory returns when the error is sent
 * (e2e_test_pipeline_hostile_multipart); the bound on the peak is who may
 * connect: loopback, or CURVE with listed client keys (exposure.c). */
#define COORD_HARD_MESSAGE_FACTOR 2
/* After a client message of at least this many bytes is freed, freed heap
 * memory is handed back to the OS (malloc_trim): glibc would otherwise keep
 * it resident (the I/O thread's arena, a raised mmap threshold). */
#define COORD_TRIM_AFTER_BYTES (256u * 1024u)
/* Clients whose replies failed with EHOSTUNREACH, remembered until the poll
 * loop cancels their requests; more in one pass are caught at their next
 * failed reply. */
#define COORD_GONE_MAX 16
#define COORD_HELD_REPLIES_MAX 256
#define COORD_HELD_REPLY_MS 60000.0
/* Lane connections waiting for their first datagram (the key), and how long
 * one may wait. */
#define COORD_LANE_PENDING 4
#define COORD_LANE_HELLO_MS 2000.0
/* Lost drafts' segments waiting for their process to be gone, and how long
 * one is watched. */
#define COORD_SHM_ORPHANS 4
#define COORD_SHM_ORPHAN_MS 10000.0
/* Seeds travel as JSON numbers between processes: exact up to 2^53. */
#define COORD_SEED_MAX ((1ull << 53) - 1)
#define COORD_PAIRS_MAX PROC_CONFIG_PAIRS_MAX
/* The largest worker message taken over ZeroMQ: a draft_ready with a half
 * of a draft that shares no memory with its target, q rows included (the
 * workers' WORKER_LINK_HALF_MESSAGE_MAX). Workers are trusted peers; lanes
 * keep coordinator.max_message_bytes. */
#define COORD_WORKER_ZMQ_MESSAGE_MAX ((size_t)64 << 20)
_Static_assert(COORD_PAIRS_MAX == METRICS_PAIRS_MAX, "metrics render every pair");

enum worker_role { ROLE_DRAFT = 0, ROLE_TARGET = 1 };

struct worker {
    bool up;                 /* registered and welcomed */
    bool held;               /* draft registered before the target: waiting */
    uint8_t identity[PROTOCOL_IDENTITY_MAX];
    size_t identity_size;
    int pid;
    char model[PROC_CONFIG_PATH_MAX];
    char backend[PROC_CONFIG_NAME_MAX];
    int vocab_size;
    int32_t eos_ids[COORD_EOS_MAX];
    int n_eos;
    int max_seq_len;
    int n_slots;
    int bos_id;
    int kv_blocks, kv_block_size; /* paged KV pool; kv_blocks 0: not reported */
    cJSON *shm;              /* draft's shared-buffer descriptor (owned) */
    cJSON *shm_frames;       /* draft: the same as a "frames" descriptor, for a target that
                                shares no memory with it (owned; NULL until needed) */
    char shm_name[256];
    bool shm_posix;          /* the draft's buffer is POSIX shared memory (its "transport") */
    char shm_domain[WORKER_MSG_SHM_DOMAIN_MAX + 1]; /* its register's: "" unknown */
    double last_seen_ms;
    uint64_t gen;            /* bumped at each registration */
    int drops;               /* the register's "drops": a repeat of one registration has the same */
    /* register's "cpu": the cores a CPU backend computes on (cpu_known false
     * for a GPU backend or a worker that did not say) */
    bool cpu_known;
    char cpu_host[WORKER_MSG_CPU_HOST_MAX + 1];
    int cpu_threads;
    struct cpulist cpus;
    /* The worker's lane (lane.h, docs/protocol-notes.md "Lanes"): offered
     * with lane_key in every welcome of this registration; lane_sending once
     * the worker connected with the key and the coordinator's "lane" marker
     * went out over ZeroMQ (lane_fd is valid exactly then); lane_reading once
     * the worker's own marker came, from when its messages come on the lane.
     * Closed by registry_lane_close before the struct is cleared. */
    char lane_key[LANE_KEY_LEN + 1];
    bool lane_sending, lane_reading;
    int lane_fd;
};

/* One draft/target pair (proc_config "pairs"): its two workers and what
 * the coordinator learns and holds per pair. A sequence is admitted to one
 * pair and stays with it: its KV lives in that pair's workers, and the
 * target reads only its own draft's shared buffer. */
struct pair {
    int index;
    struct worker worker[2];
    /* adaptive-K state of this pair: each sequence starts from it and hands
     * its final state back (reset when a worker changes, since costs and
     * acceptance belong to the pair) */
    struct adaptive_k k_history;
    bool k_history_valid;
    /* what rounds cost in wall time at each load level, shared by the
     * pair's sequences' controllers (adaptive_k_load.costs); reset with
     * k_history */
    struct adaptive_k_costs wall_costs[ADAPTIVE_K_LOAD_LEVELS];
    uint64_t draft_gen;      /* bumped at each draft registration and loss */
    /* The registered draft and target compute on the same cores, more
     * threads than there are cores (registry: their "cpu"): what one runs
     * slows the other, so the draft never works beside a verification of
     * its own sequence (no pre-drafts). */
    bool cores_shared;
    /* Draft and target share no memory (their shm domains differ: other
     * hosts, other /dev/shm): each published half comes with the draft's
     * draft_ready, is kept in its sequence and goes with the verify that
     * reads it (docs/scale-out.md). */
    bool halves_as_frames;
    int n_active;            /* sequences admitted to this pair */
    int kv_reserved[2];      /* KV blocks reserved for them in each worker's pool */
    int target_outstanding;  /* verifies sent, not yet answered */
    /* The target's forward-call cost, fitted over its calls as base +
     * per_row * rows (decayed sums), for adaptive K under load; the last
     * call counted, since one call answers several rounds. */
    int64_t last_target_call;
    double call_fit_w, call_fit_x, call_fit_xx, call_fit_y, call_fit_xy;
    double call_ms_base, call_ms_per_row;
    double target_idle_since_ms; /* < 0: not idle (or unknown) */
    uint64_t target_calls;   /* forward calls its target reported */
    uint64_t requests_admitted;
    /* spec_tree "auto": whether the model-free sources' trees pay over
     * their chains on this pair, measured on rounds alone (tree_choice.h) */
    struct tree_choice trees;
};

enum seq_state {
    SEQ_FREE = 0,
    SEQ_QUEUED,
    SEQ_ACTIVE,
};

struct seq {
    enum seq_state state;
    uint64_t req;            /* coordinator-wide request number */
    int pair;                /* the pair it was admitted to (c->pair[]); 0 while queued */
    int slot;                /* its slot in that pair's workers */
    uint8_t client[PROTOCOL_IDENTITY_MAX];
    size_t client_size;
    struct conn_ref conn;    /* the connection the request came on: replies go to it only */
    char id[REQUEST_ID_MAX + 1];
    int index, n_choices;    /* which of the request's n choices it is ("index" in replies when n > 1) */
    bool stream;
    bool ignore_eos;         /* an EOS id does not end it (the request's ignore_eos) */
    int max_tokens;
    struct sampling_params sp;
    enum speculate_mode mode;
    struct sampling_controls ctl; /* logit bias, penalties: the target applies them per row */
    cJSON *grammar;          /* structured output: the grammar's wire form (grammar_spec.h), sent
                                with the prompt to both workers; NULL: none */
    struct seq_grammar *gram; /* its matcher here (constraint.c), made at the first cut */
    int32_t *pred;           /* the request's prediction as tokens (a draft source, drafters.c); NULL: none */
    int n_pred;
    int pred_at;             /* where in pred the last prediction draft started (the next search's hint) */
    int pred_accepted, pred_rejected; /* prediction drafts accepted and rejected (usage) */
    bool gram_failed;        /* the matcher could not be made: drafts go uncut */
    struct adaptive_k kc;
    enum request_draft draft; /* where its drafts come from (never DEFAULT once queued) */
    int spec_tree;           /* its token trees: REQUEST_SPEC_TREE_OFF, _AUTO or a node budget */
    bool spec_off;           /* draft errors: target-only for this sequence */
    int draft_errors;
    bool replies_stalled;    /* a token event met the client's full queue */

    int32_t *hist;           /* prompt + generated */
    int n_hist, cap_hist, n_prompt;
    int prompt_cached;       /* prompt tokens the target found in its prefix cache */
    int generated;
    int target_len;
    int draft_valid;         /* leading tokens of hist the draft's cache holds */
    uint64_t draft_gen;      /* draft registration the draft_valid refers to */
    bool draft_prefilling;   /* the draft's prefill of the prompt is not done yet */
    struct output *out;
    struct seq_logprobs lp;  /* the request's logprobs, per generated token */
    int stream_from;         /* first generated index not yet streamed */

    /* the round: its state, the calls in flight, the pre-draft beside it
     * and its timing (round.h) */
    struct round round;
    /* what matched drafts were worth to this request (drafters.c), per
     * source ([0] n-gram, [1] suffix cache): drafts accepted, drafts put to
     * the test (each accepted one and the first rejected) */
    int match_accepted[2], match_trials[2];
    int match_miss_run;      /* plain steps the next lookup that finds nothing sends (scheduler.c) */
    /* halves_as_frames: the bytes of each half as the draft last published
     * it (malloc'd), for the verify that reads it */
    void *half_bytes[2];
    size_t half_len[2];

    /* stats */
    double t_arrival_ms, t_admit_ms, t_first_ms;
    int kv_reserved[2];      /* KV blocks held for it in each worker's pool ([role]) */
    bool kv_waited;          /* its admission waited for KV blocks (counted once) */
    int rounds, drafted, accepted, predraft_offered, predraft_used;
    int accepted_at[SPECULATE_K_MAX]; /* rounds whose draft position i was accepted */
    int tree_rounds, tree_nodes, tree_accepted; /* verify_tree rounds: nodes verified, path lengths */
    double draft_ms, verify_ms;
    struct seq *next_queued; /* FIFO of queued sequences */
};

struct exposure;

/* The in-process transport (docs/one-core.md): a caller that runs the
 * scheduler in its own process, without sockets, sets coordinator.local,
 * and every message that would leave for a worker or a client is handed to
 * it instead, still as the encoded header the socket would carry. NULL in
 * tandem-coordinator. Borrowed: it outlives the coordinator's use of it.
 * Both hooks run on the coordinator's thread and may not call back into
 * the scheduler (they queue; the caller's loop delivers later). */
struct coord_local {
    /* A command to the worker whose routing id is identity (the one its
     * register came with; a refusal goes to an unregistered one). hdr and
     * frames are borrowed for the call: the transport copies what it
     * keeps. 0, or a negative code that worker_send logs. */
    int (*send)(void *user, const uint8_t *identity, size_t identity_size, const cJSON *hdr,
                const struct protocol_frame *frames, int n_frames);
    /* A reply to the client whose routing id is identity, borrowed for the
     * call. 0 taken; nonzero: dropped (replies_send reports it failed). */
    int (*reply)(void *user, const uint8_t *identity, size_t identity_size, const cJSON *msg);
    void *user;
};

struct coordinator {
    struct proc_config cfg;
    const struct coord_local *local; /* NULL: sockets (the process) */
    int readiness_written;   /* the workers' state last written by readiness.c, -1: none */
    bool readiness_warned;
    void *zctx;
    void *clients;
    void *workers;
    bool clients_bound, workers_bound; /* ours to unlink (ipc://) on destroy */
    struct tokenizer *tk;    /* NULL: no tokenizer.json */
    struct exposure *exposure; /* CURVE and the ZAP handler of the client endpoint */
    struct connections *conns; /* the client socket's connections (monitor) */
    int n_conn_drops;        /* drops seen, not yet swept (intake_watch_connections) */
    /* The client message being answered (intake), while it is: a reply to
     * its routing id goes out only while its connection is open, so an id
     * reused by a newcomer in between never gets the old client's answer. */
    struct {
        bool active;
        const uint8_t *identity;
        size_t identity_size;
        struct conn_ref conn;
    } answering;
    struct pair pair[COORD_PAIRS_MAX];
    int n_pairs;             /* cfg.n_pairs */
    /* Lanes: the listening socket beside an ipc:// worker endpoint
     * (coordinator.worker_lane), and connections not yet matched to a
     * worker by their key (closed after COORD_LANE_HELLO_MS). */
    int lane_listen_fd;
    bool lane_listening;
    char lane_path[LANE_PATH_MAX + 1];
    int lane_pending[COORD_LANE_PENDING];
    double lane_pending_ms[COORD_LANE_PENDING];
    int n_lane_pending;
    /* A lost draft's segment is removed once its process is gone. A lane
     * reports a death at once, before the parent has reaped the process,
     * and kill(pid, 0) still finds a zombie: the removal is retried on the
     * ticks (registry_tick) for COORD_SHM_ORPHAN_MS. */
    struct {
        char name[256];
        int pid;
        double since_ms;
    } shm_orphans[COORD_SHM_ORPHANS];
    int n_shm_orphans;
    struct seq *seqs;        /* n_pairs * cfg.max_concurrency active + max_queue queued */
    int n_seqs;
    int n_active, n_queued;
    struct seq *queue_head, *queue_tail;
    uint64_t next_req;
    enum speculate_mode default_mode;
    enum request_draft default_draft; /* coordinator.draft: requests that name no source */
    int default_spec_tree;   /* coordinator.spec_tree: requests that name none (request.h's values) */
    struct ngram_params ngram;
    struct suffix_cache *suffix;      /* finished requests' tokens; NULL: off (suffix_cache_mib 0) */
    struct coord_grammar *grammar;    /* the tokenizer's bytes and the engines of requests' grammars
                                         (constraint.c); NULL until the first grammar's cut */
    struct metrics metrics;
    double t_start_ms;
    double last_heartbeat_ms;
    uint64_t rng_state;
    size_t max_message_bytes;
    /* Continuous batching: KV blocks are reserved in each pair's pools for
     * its active sequences (their worst case, so a worker never runs out
     * mid-request; struct pair). */
    double busy_since_ms;        /* < 0: no active sequence */
    /* clients that vanished (replies.c notes them, scheduler_cancel_gone
     * cancels their requests outside of any scheduler call) */
    uint8_t gone[COORD_GONE_MAX][PROTOCOL_IDENTITY_MAX];
    size_t gone_size[COORD_GONE_MAX];
    int n_gone;
    /* final replies (done, error) a client's full queue refused, sent again
     * on every tick until it reads them, goes away, or COORD_HELD_REPLY_MS
     * pass (replies.c) */
    struct held_reply {
        uint8_t identity[PROTOCOL_IDENTITY_MAX];
        size_t identity_size;
        cJSON *msg;
        double since_ms;
    } held[COORD_HELD_REPLIES_MAX];
    int n_held;
};

static inline double coord_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1000.0 + (double)ts.tv_nsec / 1e6;
}

/* The draft's buffer descriptor as pair p's target must see it: a "frames"
 * copy where they share no memory. NULL when no draft buffer is known. */
static inline const cJSON *coord_draft_descriptor(const struct pair *p)
{
    const struct worker *d = &p->worker[ROLE_DRAFT];
    return p->halves_as_frames ? d->shm_frames : d->shm;
}

/* Whether s's draft source may draft with the draft worker's model. */
static inline bool coord_seq_uses_model(const struct seq *s)
{
    return s->draft == REQUEST_DRAFT_MODEL || s->draft == REQUEST_DRAFT_AUTO;
}

/* The pair s was admitted to. */
static inline struct pair *coord_pair_of(struct coordinator *c, const struct seq *s)
{
    return &c->pair[s->pair];
}

/* The target s was admitted to. */
static inline const struct worker *coord_target_of(const struct coordinator *c, const struct seq *s)
{
    return &c->pair[s->pair].worker[ROLE_TARGET];
}

/* Whether id ends s (one of its target's EOS ids). */
static inline bool coord_is_eos(const struct coordinator *c, const struct seq *s, int32_t id)
{
    const struct worker *t = coord_target_of(c, s);
    for (int i = 0; i < t->n_eos; i++)
        if (t->eos_ids[i] == id)
            return true;
    return false;
}

/* Its target's context length: the longest s may grow. */
static inline int coord_context_len(const struct coordinator *c, const struct seq *s)
{
    return coord_target_of(c, s)->max_seq_len;
}

/* The shortest context of the registered targets: what a request is
 * checked against before it is admitted to one (0: none up). */
static inline int coord_min_context_len(const struct coordinator *c)
{
    int n = 0;
    for (int p = 0; p < c->n_pairs; p++) {
        const struct worker *t = &c->pair[p].worker[ROLE_TARGET];
        if (t->up && (n == 0 || t->max_seq_len < n))
            n = t->max_seq_len;
    }
    return n;
}

/* A registered target, preferring pair 0's (the model facts requests are
 * checked against before admission: every pair's target has the same
 * vocabulary, registry.c checks it); NULL when none is up. */
static inline const struct worker *coord_any_target(const struct coordinator *c)
{
    for (int p = 0; p < c->n_pairs; p++)
        if (c->pair[p].worker[ROLE_TARGET].up)
            return &c->pair[p].worker[ROLE_TARGET];
    return NULL;
}

static inline const char *coord_role_name(enum worker_role role)
{
    return role == ROLE_DRAFT ? "draft" : "target";
}

#endif
