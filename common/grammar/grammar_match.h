/* grammar_match.h: the byte-level pushdown matcher of a grammar, and a
 * sequence's position in it.
 *
 * What it is: an engine that runs a grammar (grammar.h) as a
 * nondeterministic pushdown automaton over bytes and determinizes it lazily.
 * A "state" is the set of stacks the automaton can be in after the bytes
 * seen so far; stacks are interned (shared tails, one id per distinct stack)
 * and so are the sets, so a state is one int32 id, and the transition from a
 * state on a byte is computed once and kept in the state's row of 256 ids.
 * A sequence's matcher is then just its current state id: a snapshot is a
 * copy of an int, a rollback an assignment (grammar_matcher below keeps one
 * id per token for speculation's rollbacks).
 *
 * What it is not: thread-safe. An engine memoizes as it runs; one engine is
 * used from one thread at a time (a coordinator thread, a worker thread).
 * Ids stay valid for the engine's life: nothing is evicted, and the memory
 * the engine may hold is capped (grammar_engine_create); past the cap a step
 * fails with ERR_NOMEM rather than evicting states a matcher still holds.
 *
 * State GRAMMAR_STATE_DEAD (0) is the empty set: no continuation is valid.
 */
#ifndef TANDEM_GRAMMAR_MATCH_H
#define TANDEM_GRAMMAR_MATCH_H

#include "grammar.h"

#include <stddef.h>
#include <stdint.h>

#define GRAMMAR_STATE_DEAD 0
/* Rules nested at one position of the input, at most (deeper: ERR_RANGE). */
#define GRAMMAR_EXPAND_DEPTH_MAX 2048
/* Stacks in one state, at most (more: ERR_RANGE). A JSON schema's states hold
 * a few dozen; only an ambiguous grammar comes near. */
#define GRAMMAR_SET_STACKS_MAX 4096
/* Default cap on an engine's memory (interned stacks, sets and rows). */
#define GRAMMAR_ENGINE_MEMORY_DEFAULT ((size_t)256 << 20)

struct grammar_engine;

/* Takes ownership of g (freed by destroy, also on failure). memory_max_bytes:
 * the cap described above (0: the default). ERR_NOMEM, ERR_RANGE (rules
 * nested past GRAMMAR_EXPAND_DEPTH_MAX, a state past GRAMMAR_SET_STACKS_MAX). */
int grammar_engine_create(struct grammar_engine **out, struct grammar *g, size_t memory_max_bytes,
                          char *err);
void grammar_engine_destroy(struct grammar_engine *e); /* NULL-safe */

/* The state before any byte. */
int32_t grammar_engine_start(const struct grammar_engine *e);

/* 1 when the bytes that led to `state` form a complete sentence of the
 * grammar (the output may end here). */
int grammar_engine_can_end(const struct grammar_engine *e, int32_t state);

/* The transitions of `state` on all 256 bytes (GRAMMAR_STATE_DEAD where the
 * byte is refused), computed on first use. The row lives as long as e.
 * NULL with ERR_NOMEM in *rc (and the reason in err) past the memory cap,
 * ERR_RANGE past GRAMMAR_EXPAND_DEPTH_MAX or GRAMMAR_SET_STACKS_MAX. */
const int32_t *grammar_engine_row(struct grammar_engine *e, int32_t state, int *rc, char *err);

/* Feeds bytes[0..len) from `state`; *next is the state after them, DEAD as
 * soon as one is refused. Returns 0, or an error of grammar_engine_row. */
int grammar_engine_feed(struct grammar_engine *e, int32_t state, const void *bytes, size_t len,
                        int32_t *next, char *err);

/* Number of states made so far, and the bytes the engine holds. */
int32_t grammar_engine_n_states(const struct grammar_engine *e);
size_t grammar_engine_memory(const struct grammar_engine *e);

/* A sequence's matcher: its state after each accepted token, so that rejected
 * drafts roll back in O(1). Plain data over a borrowed engine. */
struct grammar_matcher {
    struct grammar_engine *engine; /* borrowed */
    int32_t *states;               /* states[0] start, states[i] after i tokens */
    size_t n_tokens, cap;
};

int grammar_matcher_init(struct grammar_matcher *m, struct grammar_engine *e);
void grammar_matcher_free(struct grammar_matcher *m);
static inline int32_t grammar_matcher_state(const struct grammar_matcher *m)
{
    return m->states[m->n_tokens];
}
/* Advances by one token's bytes. ERR_INVALID_ARG (the state unchanged) when
 * the grammar refuses them; ERR_NOMEM. */
int grammar_matcher_accept(struct grammar_matcher *m, const void *bytes, size_t len, char *err);
/* Forgets the last n tokens (n <= n_tokens, else ERR_RANGE). */
int grammar_matcher_rollback(struct grammar_matcher *m, size_t n);

#endif
