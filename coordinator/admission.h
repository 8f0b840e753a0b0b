/* admission.h: KV admission of the coordinator's sequences: the blocks a
 * sequence may come to hold in each worker's paged KV pool, and whether the
 * pools can take it now, later or never (docs/batching.md). The scheduler
 * reserves at admission what these say, so a worker never runs out of
 * blocks in the middle of a request.
 */
#ifndef TANDEM_ADMISSION_H
#define TANDEM_ADMISSION_H

#include "coord_state.h"

#define ADMISSION_LATER (-1)
#define ADMISSION_NEVER (-2)

/* Blocks s may come to hold in pair p's worker r's pool (0: r reported no
 * pool). */
int admission_kv_blocks(const struct coordinator *c, const struct pair *p, enum worker_role r,
                        const struct seq *s);

/* Sequences pair p can hold at once: its target's slots, at most
 * coordinator.max_concurrency. */
int admission_pair_slots(const struct coordinator *c, const struct pair *p);

/* The pair to admit s to now: among the pairs with a registered target, a
 * free slot and room in their pools, the one whose target has the most
 * free KV blocks, then the fewest sequences. ADMISSION_LATER: some pair
 * could hold it once blocks or slots come back; ADMISSION_NEVER: no
 * registered target's pool could ever hold it (*need_out: the blocks it
 * would need). A sequence the chosen pair's draft pool could never hold is
 * set to run without the model's drafts (spec_off) rather than refused. */
int admission_choose_pair(const struct coordinator *c, struct seq *s, int *need_out);

#endif
