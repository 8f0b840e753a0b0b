/* constraint.h: the coordinator's view of a request's grammar (structured
 * output, docs/grammar.md): drafts made here (n-grams, the suffix cache)
 * are cut at the first token the grammar refuses, so the target never
 * spends a verification row on a draft its mask must reject.
 *
 * What it is not: what keeps the output exact. The target masks every row
 * (a refused draft is rejected there whatever this file does) and allows
 * an EOS only where the grammar can end; a coordinator without a tokenizer
 * or out of memory only cuts nothing (logged once per request).
 * One thread (the poll loop), like the engines.
 */
#ifndef TANDEM_CONSTRAINT_H
#define TANDEM_CONSTRAINT_H

#include <stdint.h>

struct coordinator;
struct seq;
struct seq_grammar;

/* How many of drafts[0..k) the grammar of s takes after its tokens so far
 * (k when s has none or its matcher could not be made). The matcher is
 * made on first use and follows s->hist. */
int constraint_cut(struct coordinator *c, const struct seq *s, const int32_t *drafts, int k);

/* s's matcher given back (scheduler_seq_reset). NULL-safe. */
void constraint_seq_free(struct seq_grammar *g);

/* The coordinator's vocabulary and engine cache (coordinator_destroy).
 * NULL-safe. */
void constraint_free(struct coordinator *c);

#endif
