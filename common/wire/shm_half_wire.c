/* shm_half_wire.c: see shm_half_wire.h. */
#include "shm_half_wire.h"

#include <stdlib.h>
#include <string.h>

#include "error.h"

int shm_half_pack(struct shm_buffer *buf, int slot, int half, int q_rows, void **out, size_t *out_len,
                  char *err)
{
    *out = NULL;
    *out_len = 0;
    struct shm_half_info info;
    uint64_t seq = 0;
    int rc = shm_buffer_half_read(buf, slot, half, &info, &seq);
    if (rc)
        return error_set(err, rc, "shm slot %d half %d: not published", slot, half);
    const struct shm_layout *lay = shm_buffer_layout(buf);
    const uint32_t n_tok = info.first + info.k;
    if (q_rows > (int)n_tok)
        q_rows = (int)n_tok; /* rows written past the half's tokens are nobody's */
    if (n_tok > (uint32_t)lay->k_max + 1 || q_rows < 0 || (q_rows != 0 && (uint32_t)q_rows != n_tok))
        return error_set(err, ERR_RANGE, "shm slot %d half %d: %u tokens, %d q rows", slot, half, n_tok, q_rows);
    const size_t row_bytes = (size_t)lay->vocab * sizeof(float);
    const size_t len = sizeof(struct shm_half_wire_header) + n_tok * sizeof(int32_t) + (size_t)q_rows * row_bytes;
    char *p = malloc(len);
    if (!p)
        return error_set(err, ERR_NOMEM, "shm half: out of memory packing %zu bytes", len);
    const struct shm_half_wire_header h = {.req = info.req, .round = info.round, .k = info.k, .first = info.first,
                                           .guess = info.guess, .rows = (uint32_t)q_rows,
                                           .vocab = (uint32_t)lay->vocab};
    memcpy(p, &h, sizeof h);
    memcpy(p + sizeof h, shm_buffer_half_tokens(buf, slot, half), n_tok * sizeof(int32_t));
    if (q_rows > 0)
        memcpy(p + sizeof h + n_tok * sizeof(int32_t), shm_buffer_half_q(buf, slot, half),
               (size_t)q_rows * row_bytes);
    /* the owner is the only writer and packs between its own publish and
     * the next begin_write: the half cannot have moved */
    *out = p;
    *out_len = len;
    return 0;
}

int shm_half_store(struct shm_buffer *buf, int slot, int half, const void *bytes, size_t len, char *err)
{
    if (strcmp(shm_buffer_transport(buf), "frames") != 0)
        return error_set(err, ERR_INVALID_ARG, "shm %s: halves arrive as bytes only into a \"frames\" buffer",
                         shm_buffer_name(buf));
    const struct shm_layout *lay = shm_buffer_layout(buf);
    if (slot < 0 || slot >= lay->n_slots || half < 0 || half > 1)
        return error_set(err, ERR_PROTOCOL, "shm half bytes: slot %d half %d outside the buffer (%d slots)", slot,
                         half, lay->n_slots);
    struct shm_half_wire_header h;
    if (len < sizeof h)
        return error_set(err, ERR_PROTOCOL, "shm half bytes: %zu bytes, shorter than its header", len);
    memcpy(&h, bytes, sizeof h);
    const uint64_t n_tok = (uint64_t)h.first + h.k;
    if (h.first > 1 || n_tok > (uint64_t)lay->k_max + 1)
        return error_set(err, ERR_PROTOCOL, "shm half bytes: first %u, k %u (k_max %d)", h.first, h.k, lay->k_max);
    if (h.vocab != (uint32_t)lay->vocab || (h.rows != 0 && h.rows != n_tok))
        return error_set(err, ERR_PROTOCOL, "shm half bytes: %u q rows of %u, want 0 or %llu of %d", h.rows,
                         h.vocab, (unsigned long long)n_tok, lay->vocab);
    const size_t row_bytes = (size_t)lay->vocab * sizeof(float);
    const size_t want = sizeof h + n_tok * sizeof(int32_t) + (size_t)h.rows * row_bytes;
    if (len != want)
        return error_set(err, ERR_PROTOCOL, "shm half bytes: %zu bytes, the header says %zu", len, want);
    const char *p = bytes;
    shm_buffer_half_begin_write(buf, slot, half);
    memcpy(shm_buffer_half_tokens(buf, slot, half), p + sizeof h, n_tok * sizeof(int32_t));
    if (h.rows > 0)
        memcpy(shm_buffer_half_q(buf, slot, half), p + sizeof h + n_tok * sizeof(int32_t), h.rows * row_bytes);
    const struct shm_half_info info = {.req = h.req, .round = h.round, .k = h.k, .first = h.first,
                                       .guess = h.guess};
    shm_buffer_half_publish(buf, slot, half, &info);
    return 0;
}
