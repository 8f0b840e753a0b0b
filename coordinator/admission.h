/* admission.h: KV admission of the coordinator's sequences: the blocks a
 * sequence may come to hold in each worker's paged KV pool, and whether the
 * pools can take it now, later or never (docs/batching.md). The scheduler
 * reserves at admission what these say, so a worker never runs out of
 * blocks in the middle of a request.
 */
#ifndef TANDEM_ADMISSION_H
#define TANDEM_ADMISSION_H

#include "coord_state.h"

/* Blocks s may come to hold in worker r's pool (0: r reported no pool). */
int admission_kv_blocks(const struct coordinator *c, enum worker_role r, const struct seq *s);

/* 1: the pools can hold s now; 0: later (blocks must come back first);
 * -1: never (the target's pool is too small; *need_out: the blocks it
 * would need there). A sequence the draft's pool could never hold is set
 * to run without the model's drafts (spec_off) rather than refused. */
int admission_kv_fits(const struct coordinator *c, struct seq *s, int *need_out);

#endif
