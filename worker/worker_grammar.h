/* worker_grammar.h: structured output in a worker: the grammars of the
 * sequences it holds, one struct specdec_grammar per slot.
 *
 * A sequence's grammar comes with its prompt (the prefill each worker
 * gets: grammar_spec.h's wire form) and lasts until the
 * slot's next prompt. Engines are compiled once per grammar text and kept
 * in a small cache keyed by its hash, shared by the slots with the same
 * grammar, so the masks a schema needs stay warm across requests. The
 * vocabulary's bytes come from the tokenizer in the worker's model
 * directory, read on the first grammar (a worker never sent one reads
 * nothing).
 *
 * What it is not: the masking itself (common/engine's halves do it) or a
 * validator: the coordinator compiled the grammar before sending it, so a
 * failure here is the worker's (no tokenizer, out of memory) and named.
 * One thread, like the engines.
 */
#ifndef TANDEM_WORKER_GRAMMAR_H
#define TANDEM_WORKER_GRAMMAR_H

#include <cjson/cJSON.h>

#include "model_config.h"
#include "specdec.h"

struct worker_grammar;

/* model_dir: where tokenizer.json is (read lazily); eos ids from mc
 * (copied). n_slots: the slots' states. */
int worker_grammar_create(struct worker_grammar **out, const char *model_dir,
                          const struct model_config *mc, int n_slots, char *err);
void worker_grammar_destroy(struct worker_grammar *wg); /* NULL-safe */

/* The slot's grammar from now on: the wire form `grammar` (NULL: none),
 * its prompt n_prompt tokens long. 0, or the error (the slot then has
 * none). */
int worker_grammar_set(struct worker_grammar *wg, int slot, const cJSON *grammar, int n_prompt,
                       char *err);

/* The slot's state for a job (NULL: no grammar). */
struct specdec_grammar *worker_grammar_slot(struct worker_grammar *wg, int slot);

#endif
