/* kv_layout.c: the one check of a paged-cache description (struct
 * kern_kv_layout) that every backend runs before it reads or writes a pool.
 * Lives in its own library because both the CPU ops and the CUDA backend
 * call it, and the CUDA library is linked below the CPU one. */
#include <stdint.h>

#include "error.h"
#include "kernels.h"

/* Row i's tree path, where it has one: a depth within its position, slots
 * strictly increasing from the first logical position of the tree on, the
 * last inside the table. */
static int path_check(const struct kern_kv_layout *kv, int i, int64_t covered, const char *op,
                      char *err)
{
    if (!kv->path_offset)
        return 0;
    const int32_t o0 = kv->path_offset[i], o1 = kv->path_offset[i + 1], pos = kv->rows[2 * i + 1];
    if (o1 < o0)
        return error_set(err, ERR_INVALID_ARG, "%s: row %d's path ends (%d) before it starts (%d)",
                         op, i, o1, o0);
    if (o1 == o0)
        return 0;
    /* in 64 bits: pos and the offsets come from a message, any int32 */
    const int64_t depth = (int64_t)o1 - o0;
    if (depth > (int64_t)pos + 1)
        return error_set(err, ERR_RANGE, "%s: row %d is a tree node of depth %lld at position %d",
                         op, i, (long long)depth, pos);
    int64_t prev = (int64_t)pos - depth; /* the first slot is at least L */
    for (int32_t j = o0; j < o1; j++) {
        if (kv->path_phys[j] <= prev || kv->path_phys[j] >= covered)
            return error_set(err, ERR_RANGE,
                             "%s: row %d's path puts depth %d at slot %d (after %lld, inside "
                             "%lld positions)", op, i, j - o0 + 1, kv->path_phys[j],
                             (long long)prev, (long long)covered);
        prev = kv->path_phys[j];
    }
    return 0;
}

int kern_kv_layout_check(const struct kern_kv_layout *kv, int n, const char *op, char *err)
{
    if (!kv || kv->block_size < 1 || kv->n_blocks < 1 || kv->n_seqs < 1 || kv->table_stride < 1 ||
        !kv->tables || (n > 0 && !kv->rows))
        return error_set(err, ERR_INVALID_ARG,
                         "%s: bad cache layout (block_size, n_blocks, n_seqs, table_stride must "
                         "be >= 1 and the arrays given)", op);
    const int64_t covered = (int64_t)kv->table_stride * kv->block_size;
    if (kv->path_offset && (!kv->path_phys || kv->path_offset[0] != 0))
        return error_set(err, ERR_INVALID_ARG,
                         "%s: bad tree paths (path_phys must be given, path_offset[0] must be 0)",
                         op);
    for (int i = 0; i < n; i++) {
        int rc = path_check(kv, i, covered, op, err);
        if (rc)
            return rc;
        const int32_t seq = kv->rows[2 * i], pos = kern_kv_row_slot(kv, i);
        if (seq < 0 || seq >= kv->n_seqs)
            return error_set(err, ERR_RANGE, "%s: row %d names sequence %d of %d", op, i, seq,
                             kv->n_seqs);
        if (pos < 0 || pos >= covered)
            return error_set(err, ERR_RANGE,
                             "%s: row %d sits at position %d, outside the %lld its table covers",
                             op, i, pos, (long long)covered);
        const int32_t *table = kv->tables + (size_t)seq * (size_t)kv->table_stride;
        for (int b = 0; b <= pos / kv->block_size; b++)
            if (table[b] < 0 || table[b] >= kv->n_blocks)
                return error_set(err, ERR_RANGE,
                                 "%s: row %d reads block %d of sequence %d, which names pool "
                                 "block %d of %d", op, i, b, seq, table[b], kv->n_blocks);
    }
    return 0;
}
