/* logprobs.h: a sequence's log-probabilities (the request's "logprobs"):
 * what the target reported for each generated token, kept beside the
 * history and written into the token and done replies.
 *
 * What it is: storage indexed like the generated tokens, and the reply's
 * JSON (docs/protocol.md, "logprobs"). What it is not: the arithmetic (the
 * target worker's, sampling.h: sampling_logprobs) nor the decision of which
 * tokens are emitted (the scheduler's).
 * Invariant: entry i belongs to generated token i; entries past the
 * sequence's generated count are stale (a round cut short by a stop) and
 * never written out.
 */
#ifndef TANDEM_COORD_LOGPROBS_H
#define TANDEM_COORD_LOGPROBS_H

#include <cjson/cJSON.h>

#include "sampling.h"
#include "tokenizer.h"
#include "worker_msg.h"

struct seq_logprobs {
    bool on;                        /* asked for (zero: not, as a reset sequence) */
    int top;                        /* the top count, 0..SAMPLING_TOP_LOGPROBS_MAX */
    struct sampling_logprobs *v;    /* [cap] */
    int cap;
    /* text_offset of entry off_index is off_chars: replies go forward, so
     * each token's text is counted once */
    int off_index, off_chars;
};

/* What a target command asks for (worker_msg.h). */
struct worker_msg_logprobs logprobs_ask(const struct seq_logprobs *lp);

/* Keeps the n entries of a verify_done at generated index at. 0; ERR_PROTOCOL
 * when they were asked for and the reply has none; ERR_NOMEM. Nothing when
 * not asked for. */
int logprobs_keep(struct seq_logprobs *lp, int at, const struct worker_msg_verify_done *m,
                  char *err);

/* Adds "logprobs": one object per generated token from..from+n-1 (ids
 * [from + n]: every generated id), each {"id","token","bytes","logprob",
 * "text_offset","top_logprobs"}; token is its text (invalid UTF-8
 * replaced), bytes its raw bytes (tk NULL: "" and []), text_offset the
 * characters of the tokens before it (code points of their "token"s).
 * Nothing when not asked for. False when out of memory. */
bool logprobs_add_json(cJSON *obj, const struct tokenizer *tk, struct seq_logprobs *lp,
                       const int32_t *ids, int from, int n);

void logprobs_free(struct seq_logprobs *lp);

#endif
