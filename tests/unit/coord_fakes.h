/* coord_fakes.h: what a coordinator module's unit test puts in place of
 * the process's edges. What would leave the process is recorded: the
 * commands to the workers (worker_send, worker_send_to_identity), kept as
 * the worker would receive them, and the client replies (replies_*).
 * Everything else (the scheduler, the registry, round timing, output,
 * metrics, the worker-message codecs) is the real code. Not thread-safe;
 * one test at a time (log_clear between tests).
 */
#ifndef TANDEM_COORD_FAKES_H
#define TANDEM_COORD_FAKES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "coord_state.h"

#define COORD_FAKES_LOG_MAX 64
/* sent.role of a message sent to a routing id (worker_send_to_identity) */
#define COORD_FAKES_TO_IDENTITY (-1)

struct sent {
    int role;                /* enum worker_role, or COORD_FAKES_TO_IDENTITY */
    int pair;                /* the pair of the worker it went to (-1: to a routing id) */
    uint8_t identity[PROTOCOL_IDENTITY_MAX];
    size_t identity_size;    /* COORD_FAKES_TO_IDENTITY: the routing id */
    struct protocol_msg msg; /* as the worker would receive it */
};

struct replies {
    int errors, dones, streams, sends;
    bool queue_full;         /* set by a test: token events meet the client's full queue */
    enum metrics_error last_error;
    char last_error_id[REQUEST_ID_MAX + 1], last_error_message[512];
    char last_sent[65536];   /* replies_send's last message, printed (truncated) */
    enum metrics_finish last_finish;
    int32_t done_ids[256];   /* the done reply's generated ids */
    int n_done_ids;
};

extern struct sent sent_log[COORD_FAKES_LOG_MAX];
extern int n_sent, next_sent; /* recorded, and the next one a test looks at */
extern struct replies rep;

/* hdr (and frame) as a worker would receive them, parsed again. */
struct protocol_msg over_the_wire(cJSON *h, const struct protocol_frame *frame);
/* Empties the records (frees what they hold). */
void log_clear(void);

/* The next recorded message, which must be of this type to this role's
 * worker (or COORD_FAKES_TO_IDENTITY); fails the test otherwise. */
struct protocol_msg *next_command(int role, const char *type);
/* Fails the test if anything more was sent. */
void no_more_commands(void);

/* A request as intake fills it in: greedy, K fixed by k_fixed (0 = the
 * controller's), drafts from the draft worker's model, queued and admitted
 * where it fits. */
struct seq *request(struct coordinator *c, const int32_t *prompt, int n_prompt, int max_tokens, int k_fixed);
/* The same with its drafts from `draft`. */
struct seq *request_from(struct coordinator *c, const int32_t *prompt, int n_prompt, int max_tokens, int k_fixed,
                         enum request_draft draft);

/* A coordinator as coordinator_create leaves it before any worker
 * registers: the config's defaults, n_seqs free records (max_concurrency
 * n_seqs), empty records cleared. 0 or -1 (out of memory). */
int coord_test_init(struct coordinator *c, int n_seqs);
/* Frees what the records and the workers' descriptors hold. */
void coord_test_fini(struct coordinator *c);

#endif
