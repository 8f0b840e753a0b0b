/* walk.c: see walk.h. */
#include "walk.h"

#include "error.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

uint64_t walk_rand(struct walk_ctx *w)
{
    /* splitmix64 */
    uint64_t z = (w->rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double now_s(void)
{
    struct timespec ts;
    /* the thread's CPU time: on a shared machine, wall time measures the
     * neighbours too */
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int record_time(struct walk_ctx *w, double t)
{
    if (w->n_times == w->cap_times) {
        size_t cap = w->cap_times ? w->cap_times * 2 : 1024;
        double *p = realloc(w->times, cap * sizeof *p);
        if (!p)
            return ERR_NOMEM;
        w->times = p, w->cap_times = cap;
    }
    w->times[w->n_times++] = t;
    return 0;
}

/* The k-th allowed token (k < count). */
static int32_t nth_allowed(const uint64_t *bits, size_t words, uint64_t k)
{
    for (size_t i = 0; i < words; i++) {
        uint64_t n = (uint64_t)__builtin_popcountll(bits[i]);
        if (k >= n) {
            k -= n;
            continue;
        }
        uint64_t x = bits[i];
        while (k--)
            x &= x - 1;
        return (int32_t)(i * 64 + (size_t)__builtin_ctzll(x));
    }
    return -1;
}

/* The first byte of a shortest byte path from `state` to a state where the
 * grammar can end (a breadth-first search over the engine's rows, at most
 * 20,000 states); -1 when none is found. */
static int shortest_first_byte(struct walk_ctx *w, int32_t state)
{
    enum { LIMIT = 20000 };
    int32_t *queue = malloc(LIMIT * sizeof *queue);
    int16_t *first = malloc(LIMIT * sizeof *first);
    size_t cap_seen = (size_t)grammar_engine_n_states(w->engine) + 4096, head = 0, tail = 0;
    uint8_t *seen = calloc(cap_seen, 1); /* by state id */
    int found = -1;
    char err[ERR_MSG_MAX];
    if (!queue || !first || !seen)
        goto done;
    queue[tail] = state, first[tail++] = -1, seen[state] = 1;
    while (head < tail && found < 0) {
        int32_t s = queue[head];
        int f = first[head++], rc;
        const int32_t *row = grammar_engine_row(w->engine, s, &rc, err);
        for (int b = 0; row && b < 256 && found < 0; b++) {
            int32_t t = row[b];
            if (t == GRAMMAR_STATE_DEAD)
                continue;
            if (grammar_engine_can_end(w->engine, t)) {
                found = f < 0 ? b : f;
                break;
            }
            if ((size_t)t >= cap_seen) { /* rows made new states */
                size_t n = (size_t)t * 2 + 1;
                uint8_t *g = realloc(seen, n);
                if (!g)
                    goto done;
                memset(g + cap_seen, 0, n - cap_seen);
                seen = g, cap_seen = n;
            }
            if (seen[t] || tail >= LIMIT)
                continue;
            seen[t] = 1;
            queue[tail] = t, first[tail++] = (int16_t)(f < 0 ? b : f);
        }
    }
done:
    free(queue);
    free(first);
    free(seen);
    return found;
}

static int32_t pick(struct walk_ctx *w, int32_t state, int closing)
{
    size_t words = token_mask_words(w->mask);
    if (closing && walk_rand(w) % 2) {
        int b = shortest_first_byte(w, state);
        if (b >= 0 && w->single_byte[b] >= 0 && token_mask_test(w->bits, w->single_byte[b]))
            return w->single_byte[b];
    }
    if (closing) {
        static const char prefer[] = "\"}]0ntf";
        /* now and then another byte, so a loop over a preferred one (digits)
         * still ends */
        for (const char *p = walk_rand(w) % 4 ? prefer : ""; *p; p++) {
            int32_t id = w->single_byte[(uint8_t)*p];
            if (id >= 0 && token_mask_test(w->bits, id))
                return id;
        }
        int32_t singles[256], n = 0;
        for (int b = 0; b < 256; b++)
            if (w->single_byte[b] >= 0 && token_mask_test(w->bits, w->single_byte[b]))
                singles[n++] = w->single_byte[b];
        if (n)
            return singles[walk_rand(w) % (uint64_t)n];
    }
    uint64_t count = 0;
    for (size_t i = 0; i < words; i++)
        count += (uint64_t)__builtin_popcountll(w->bits[i]);
    return count ? nth_allowed(w->bits, words, walk_rand(w) % count) : -1;
}

static int append(char **buf, size_t *len, size_t *cap, const uint8_t *p, size_t n)
{
    if (*len + n + 1 > *cap) {
        size_t c = *cap ? *cap * 2 : 256;
        while (c < *len + n + 1)
            c *= 2;
        char *q = realloc(*buf, c);
        if (!q)
            return ERR_NOMEM;
        *buf = q, *cap = c;
    }
    memcpy(*buf + *len, p, n);
    *len += n;
    (*buf)[*len] = 0;
    return 0;
}

int walk_one(struct walk_ctx *w, int free_steps, int max_tokens, char **text, size_t *len,
             char *err)
{
    char *buf = NULL;
    size_t n = 0, cap = 0;
    int32_t state = grammar_engine_start(w->engine);
    int rc = append(&buf, &n, &cap, (const uint8_t *)"", 0);
    for (int step = 0; rc == 0; step++) {
        int closing = step >= free_steps;
        if (grammar_engine_can_end(w->engine, state) && (closing || walk_rand(w) % 8 == 0))
            break;
        if (step >= max_tokens) {
            rc = error_set(err, ERR_INTERNAL, "the walk did not end in %d tokens: %.200s", max_tokens,
                           buf);
            break;
        }
        double t0 = now_s();
        if ((rc = token_mask_compute(w->mask, state, w->bits, err)))
            break;
        if (w->logits) /* what a request pays on top: the mask onto a row of logits */
            token_mask_apply(w->bits, w->logits, w->n_logits, &(struct token_mask_eos){0}, 0);
        if (w->times && (rc = record_time(w, now_s() - t0)))
            break;
        int32_t id = pick(w, state, closing);
        if (id < 0 && grammar_engine_can_end(w->engine, state))
            break;
        if (id < 0) {
            rc = error_set(err, ERR_INTERNAL, "no token allowed and the grammar cannot end after %.200s",
                           buf);
            break;
        }
        size_t tl;
        const uint8_t *tb = token_mask_vocab_bytes(w->vocab, id, &tl);
        if ((rc = grammar_engine_feed(w->engine, state, tb, tl, &state, err)))
            break;
        if (state == GRAMMAR_STATE_DEAD) {
            rc = error_set(err, ERR_INTERNAL, "token %d allowed by the mask, refused by the matcher",
                           id);
            break;
        }
        rc = append(&buf, &n, &cap, tb, tl);
    }
    if (rc) {
        free(buf);
        return rc;
    }
    *text = buf;
    *len = n;
    return 0;
}
