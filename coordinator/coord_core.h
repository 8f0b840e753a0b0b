/* coord_core.h: the coordinator's records without its sockets: what
 * tandem-coordinator (coordinator.c) and an in-process caller (local.c,
 * docs/one-core.md) both start from, so the two run one scheduler on the
 * same settings.
 *
 * What it is not: no socket, no poll loop, no run directory, no lane; those
 * belong to coordinator.c. Single-threaded, as every coordinator module.
 */
#ifndef TANDEM_COORD_CORE_H
#define TANDEM_COORD_CORE_H

#include "coord_state.h"

/* A coordinator of cfg (copied) with every record empty: sequences, pairs,
 * metrics, the suffix cache (coordinator.suffix_cache_mib), the tokenizer
 * of coordinator.tokenizer (none there: only prompt_ids requests are
 * served, as logged). 0 with *out set, or ERR_NOMEM, ERR_INVALID_ARG
 * (coordinator.draft), or the tokenizer's code other than a missing file. */
int coord_core_create(struct coordinator **out, const struct proc_config *cfg, char *err);

/* Frees the records (held replies, sequences, descriptors, tokenizer,
 * suffix cache, grammars) and c. The caller closed its sockets first.
 * NULL-safe. */
void coord_core_destroy(struct coordinator *c);

#endif
