/* admit.c: connection counts, in all and per client address (see admit.h).
 * A chained hash table of the addresses with open connections; an address
 * leaves it when its last connection closes, so its size follows the
 * connections, not the addresses ever seen. */
#include "admit.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>

#include "error.h"

#define ADMIT_BUCKETS 4096 /* a power of two */

struct admit_address {
    struct admit_address *next;
    uint32_t address;
    int n;
};

struct admit {
    pthread_mutex_t mu;
    int max_total, max_per_address;
    int n_total;
    struct admit_address *buckets[ADMIT_BUCKETS];
};

int admit_create(struct admit **out, int max_total, int max_per_address, char *err)
{
    *out = NULL;
    struct admit *a = calloc(1, sizeof(*a));
    if (a == NULL)
        return error_set(err, ERR_NOMEM, "admit: out of memory");
    if (pthread_mutex_init(&a->mu, NULL) != 0) {
        free(a);
        return error_set(err, ERR_SYSTEM, "admit: pthread_mutex_init failed");
    }
    a->max_total = max_total;
    a->max_per_address = max_per_address;
    *out = a;
    return 0;
}

void admit_destroy(struct admit *a)
{
    if (a == NULL)
        return;
    for (int i = 0; i < ADMIT_BUCKETS; i++) {
        while (a->buckets[i] != NULL) {
            struct admit_address *e = a->buckets[i];
            a->buckets[i] = e->next;
            free(e);
        }
    }
    pthread_mutex_destroy(&a->mu);
    free(a);
}

static struct admit_address **slot_of(struct admit *a, uint32_t address)
{
    uint32_t h = address * 2654435761u; /* Knuth's multiplicative hash: loopback and LAN addresses differ in few bits */
    struct admit_address **p = &a->buckets[(h >> 20) & (ADMIT_BUCKETS - 1)];
    while (*p != NULL && (*p)->address != address)
        p = &(*p)->next;
    return p;
}

enum admit_verdict admit_enter(struct admit *a, uint32_t address)
{
    pthread_mutex_lock(&a->mu);
    struct admit_address **p = slot_of(a, address);
    if (*p == NULL) {
        *p = calloc(1, sizeof(**p));
        if (*p == NULL) {
            pthread_mutex_unlock(&a->mu);
            return ADMIT_OVER_TOTAL;
        }
        (*p)->address = address;
    }
    enum admit_verdict v = ADMIT_OK;
    if (a->n_total >= a->max_total)
        v = ADMIT_OVER_TOTAL;
    else if (a->max_per_address > 0 && (*p)->n >= a->max_per_address)
        v = ADMIT_OVER_ADDRESS;
    (*p)->n++;
    a->n_total++;
    pthread_mutex_unlock(&a->mu);
    return v;
}

void admit_leave(struct admit *a, uint32_t address)
{
    pthread_mutex_lock(&a->mu);
    struct admit_address **p = slot_of(a, address);
    if (*p != NULL) {
        a->n_total--;
        if (--(*p)->n == 0) {
            struct admit_address *e = *p;
            *p = e->next;
            free(e);
        }
    }
    pthread_mutex_unlock(&a->mu);
}

void admit_refusal(const struct admit *a, enum admit_verdict v, struct openai_error *e)
{
    if (v == ADMIT_OVER_ADDRESS)
        openai_error_set(e, 429, "rate_limit_error", "too_many_connections", NULL,
                         "%d connections are open from this address (gateway.max_connections_per_ip); "
                         "close one or retry later",
                         a->max_per_address);
    else
        openai_error_set(e, 503, "server_error", "too_many_connections", NULL,
                         "the gateway has %d connections open (gateway.max_connections); retry later", a->max_total);
}
