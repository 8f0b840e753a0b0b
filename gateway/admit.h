/* admit.h: the gateway's connection limits, counted here rather than by
 * libmicrohttpd, so that a connection past them is answered (503 with
 * Retry-After and an OpenAI error object) instead of being closed at accept
 * without a word, which a client sees as a reset.
 *
 * What it is: a count of the open connections and one per client address
 * (IPv4; the gateway listens on IPv4 only). What it is not: the answer
 * itself (server.c writes it) or libmicrohttpd's own limit, which stays as
 * a backstop above these (server.c).
 *
 * Every connection is counted, refused ones too, from admit_enter to
 * admit_leave: each holds a socket until it is closed. Threads: any; one
 * mutex inside.
 */
#ifndef TANDEM_GATEWAY_ADMIT_H
#define TANDEM_GATEWAY_ADMIT_H

#include <stdint.h>

#include "openai.h"

enum admit_verdict {
    ADMIT_OK = 0,
    ADMIT_OVER_TOTAL,     /* gateway.max_connections open already */
    ADMIT_OVER_ADDRESS,   /* gateway.max_connections_per_ip open from this address */
};

struct admit;

/* max_per_address 0 = no limit per address. ERR_NOMEM. */
int admit_create(struct admit **out, int max_total, int max_per_address, char *err);
void admit_destroy(struct admit *a);   /* NULL-safe */
/* Counts a connection from address (network byte order) and says whether
 * the limits allowed it; counted either way (admit_leave it when it
 * closes). Out of memory is ADMIT_OVER_TOTAL: a connection that cannot be
 * counted is refused. */
enum admit_verdict admit_enter(struct admit *a, uint32_t address);
void admit_leave(struct admit *a, uint32_t address);
/* The answer to a connection refused with v (not ADMIT_OK): 503 or 429
 * too_many_connections naming the limit it is past. */
void admit_refusal(const struct admit *a, enum admit_verdict v, struct openai_error *e);

#endif
