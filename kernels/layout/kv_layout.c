/* kv_layout.c: the one check of a paged-cache description (struct
 * kern_kv_layout) that every backend runs before it reads or writes a pool.
 * Lives in its own library because both the CPU ops and the CUDA backend
 * call it, and the CUDA library is linked below the CPU one. */
#include <stdint.h>

#include "error.h"
#include "kernels.h"

int kern_kv_layout_check(const struct kern_kv_layout *kv, int n, const char *op, char *err)
{
    if (!kv || kv->block_size < 1 || kv->n_blocks < 1 || kv->n_seqs < 1 || kv->table_stride < 1 ||
        !kv->tables || (n > 0 && !kv->rows))
        return error_set(err, ERR_INVALID_ARG,
                         "%s: bad cache layout (block_size, n_blocks, n_seqs, table_stride must "
                         "be >= 1 and the arrays given)", op);
    const int64_t covered = (int64_t)kv->table_stride * kv->block_size;
    for (int i = 0; i < n; i++) {
        const int32_t seq = kv->rows[2 * i], pos = kv->rows[2 * i + 1];
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
