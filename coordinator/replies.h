/* replies.h: what the coordinator sends back to clients (docs/protocol.md):
 * token events while streaming, the done reply, error replies. */
#ifndef TANDEM_REPLIES_H
#define TANDEM_REPLIES_H

#include "coord_state.h"

/* Sends msg to the client with this routing id without blocking; a reply
 * that cannot be delivered is logged and dropped (the client went away). */
enum reply_sent {
    REPLY_SENT,
    REPLY_GONE,   /* the client's connection is gone (its requests get cancelled) */
    REPLY_FULL,   /* the client's queue is full: it does not read its replies */
    REPLY_FAILED, /* anything else, logged */
};

enum reply_sent replies_send(struct coordinator *c, const uint8_t *identity, size_t identity_size,
                             const cJSON *msg);
/* Sends again the final replies a full queue held back (on every tick);
 * one held COORD_HELD_REPLY_MS by now_ms (coord_now_ms) is dropped, counted
 * in replies_undelivered_total. */
void replies_retry_held(struct coordinator *c, double now_ms);
/* Frees what is still held (the coordinator is going away). */
void replies_free_held(struct coordinator *c);
/* Sends error {id, code, message}, counts it in the metrics and logs it. */
void replies_error(struct coordinator *c, const uint8_t *identity, size_t identity_size, const char *id,
                   enum metrics_error code, const char *message);
/* The same for sequence s, to its client: with "index" when s is one
 * choice of several (n > 1), so the client knows which one failed. */
void replies_error_of(struct coordinator *c, const struct seq *s, enum metrics_error code, const char *message);
/* Streams the tokens accepted since the last event (streaming requests
 * only). final: the request ended, flush the detokenizer's held bytes. */
void replies_stream(struct coordinator *c, struct seq *s, bool final);
/* The last stream event and the done reply of a finished sequence; t is
 * the finishing time (coord_now_ms). */
void replies_done(struct coordinator *c, struct seq *s, enum metrics_finish reason, double t);

#endif
