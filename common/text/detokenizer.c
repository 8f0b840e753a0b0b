/* detokenizer.c: streaming decode that never splits a UTF-8 sequence.
 *
 * Invariant: `held` holds at most 3 bytes, an incomplete but so far valid
 * UTF-8 prefix. Why the concatenation equals the one-shot decode: the
 * repair automaton (utf8_repair) starts a fresh sequence at every
 * lead byte, so cutting the byte stream just before a held lead byte puts the
 * automaton in its initial state on both sides of the cut.
 */
#include "detokenizer.h"

#include "error.h"
#include "tokenizer.h"
#include "utf8.h"

#include <stdlib.h>
#include <string.h>

struct detokenizer {
    const struct tokenizer *tk;
    int skip_special;
    uint8_t *raw; /* held bytes + the new token's bytes */
    size_t n_raw, cap_raw;
    char *out; /* repaired text handed to the caller */
    size_t cap_out;
};

int detokenizer_create(struct detokenizer **out, const struct tokenizer *tk, int skip_special, char *err)
{
    if (!out || !tk)
        return error_set(err, ERR_INVALID_ARG, "detokenizer_create: NULL argument");
    struct detokenizer *dt = calloc(1, sizeof *dt);
    if (!dt)
        return error_set(err, ERR_NOMEM, "detokenizer: out of memory");
    dt->tk = tk;
    dt->skip_special = skip_special;
    *out = dt;
    return 0;
}

void detokenizer_destroy(struct detokenizer *dt)
{
    if (!dt)
        return;
    free(dt->raw);
    free(dt->out);
    free(dt);
}

static int ensure(void **p, size_t *cap, size_t need)
{
    if (need <= *cap)
        return 0;
    size_t ncap = *cap ? *cap : 64;
    while (ncap < need)
        ncap *= 2;
    void *np = realloc(*p, ncap);
    if (!np)
        return -1;
    *p = np;
    *cap = ncap;
    return 0;
}

/* Repairs raw[0..n) into dt->out and drops those bytes from raw. */
static int emit(struct detokenizer *dt, size_t n, const char **piece_out, size_t *len_out, char *err)
{
    if (ensure((void **)&dt->out, &dt->cap_out, 3 * n + 1))
        return error_set(err, ERR_NOMEM, "detokenizer: out of memory");
    size_t len = utf8_repair(dt->raw, n, (uint8_t *)dt->out);
    dt->out[len] = '\0';
    memmove(dt->raw, dt->raw + n, dt->n_raw - n);
    dt->n_raw -= n;
    *piece_out = dt->out;
    *len_out = len;
    return 0;
}

int detokenizer_push(struct detokenizer *dt, int32_t id, const char **piece_out, size_t *len_out, char *err)
{
    if (!dt || !piece_out || !len_out)
        return error_set(err, ERR_INVALID_ARG, "detokenizer_push: NULL argument");
    size_t n;
    const uint8_t *bytes = tokenizer_token_bytes(dt->tk, id, &n);
    if (!bytes)
        return error_set(err, ERR_RANGE, "token id %d is not in the vocabulary (0..%d)", id,
                         tokenizer_vocab_size(dt->tk) - 1);
    if (dt->skip_special && tokenizer_is_special(dt->tk, id))
        n = 0;
    if (ensure((void **)&dt->raw, &dt->cap_raw, dt->n_raw + n + 1))
        return error_set(err, ERR_NOMEM, "detokenizer: out of memory");
    memcpy(dt->raw + dt->n_raw, bytes, n);
    dt->n_raw += n;
    size_t hold = utf8_incomplete_tail(dt->raw, dt->n_raw);
    return emit(dt, dt->n_raw - hold, piece_out, len_out, err);
}

int detokenizer_flush(struct detokenizer *dt, const char **piece_out, size_t *len_out, char *err)
{
    if (!dt || !piece_out || !len_out)
        return error_set(err, ERR_INVALID_ARG, "detokenizer_flush: NULL argument");
    if (ensure((void **)&dt->raw, &dt->cap_raw, 1))
        return error_set(err, ERR_NOMEM, "detokenizer: out of memory");
    return emit(dt, dt->n_raw, piece_out, len_out, err);
}
