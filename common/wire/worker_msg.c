/* worker_msg.c: encoders and decoders of the coordinator <-> worker messages
 * (see worker_msg.h). Every decoder goes through the protocol getters, so a
 * bad field is reported as "field: ..." and nothing here trusts a peer.
 */
#include "worker_msg.h"

#include <stdio.h>
#include <string.h>

#include "cpulist.h"
#include "error.h"
#include "proc_config.h"

/* ---- shared pieces ---- */

static bool add_seq(cJSON *h, const struct worker_msg_seq *s)
{
    return cJSON_AddNumberToObject(h, "req", (double)s->req) &&
           cJSON_AddNumberToObject(h, "slot", s->slot);
}

static int get_seq(const cJSON *h, const struct worker_msg_limits *lim, struct worker_msg_seq *s,
                   char *err)
{
    s->req = -1;
    s->slot = -1;
    int64_t req = 0;
    int rc = protocol_get_i64(h, "req", 0, WORKER_MSG_JSON_INT_MAX, &req, err);
    if (rc)
        return rc;
    s->req = req;
    int slot = 0;
    rc = protocol_get_int(h, "slot", 0, lim->n_slots > 0 ? lim->n_slots - 1 : 0, &slot, err);
    if (rc)
        return rc;
    s->slot = slot;
    return 0;
}

/* The seed travels as a decimal string: cJSON prints numbers with 15
 * significant digits, which would merge seeds that differ past that. */
static bool add_seed(cJSON *o, uint64_t seed)
{
    char text[24];
    snprintf(text, sizeof text, "%llu", (unsigned long long)seed);
    return cJSON_AddStringToObject(o, "seed", text) != NULL;
}

static int get_seed(const cJSON *s, uint64_t *out, char *err)
{
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(s, "seed");
    if (!item) {
        *out = 0;
        return 0;
    }
    if (!cJSON_IsString(item)) {
        int64_t seed = 0;
        int rc = protocol_get_i64(s, "sampling.seed", 0, WORKER_MSG_JSON_INT_MAX, &seed, err);
        *out = (uint64_t)seed;
        return rc;
    }
    const char *p = item->valuestring;
    uint64_t v = 0;
    if (*p == '\0')
        return error_set(err, ERR_PROTOCOL, "sampling.seed: expected a decimal integer, got \"\"");
    for (; *p; p++) {
        if (*p < '0' || *p > '9' || v > (UINT64_MAX - (uint64_t)(*p - '0')) / 10)
            return error_set(err, ERR_PROTOCOL,
                             "sampling.seed: expected a decimal integer below 2^64, got \"%.24s\"",
                             item->valuestring);
        v = v * 10 + (uint64_t)(*p - '0');
    }
    *out = v;
    return 0;
}

/* The controls of a "sampling" object, those that are set. */
static bool add_controls(cJSON *o, const struct sampling_controls *c)
{
    if (c->n_bias < 0 || c->n_bias > SAMPLING_BIAS_MAX)
        return false; /* never built so: encoding fails rather than read past the arrays */
    bool ok = (c->presence_penalty == 0.0f ||
               cJSON_AddNumberToObject(o, "presence_penalty", c->presence_penalty)) &&
              (c->frequency_penalty == 0.0f ||
               cJSON_AddNumberToObject(o, "frequency_penalty", c->frequency_penalty)) &&
              (c->repetition_penalty == 0.0f || c->repetition_penalty == 1.0f ||
               cJSON_AddNumberToObject(o, "repetition_penalty", c->repetition_penalty));
    cJSON *a = ok && c->n_bias > 0 ? cJSON_AddArrayToObject(o, "logit_bias") : NULL;
    for (int i = 0; a && ok && i < c->n_bias; i++) {
        cJSON *e = cJSON_CreateArray();
        if (!e || !cJSON_AddItemToArray(a, e)) {
            cJSON_Delete(e);
            return false;
        }
        ok = cJSON_AddItemToArray(e, cJSON_CreateNumber(c->bias_ids[i])) &&
             cJSON_AddItemToArray(e, cJSON_CreateNumber(c->bias[i]));
    }
    return ok && (c->n_bias == 0 || a);
}

static int get_bias(const cJSON *s, struct sampling_controls *c, char *err)
{
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(s, "logit_bias");
    if (!a)
        return 0;
    if (!cJSON_IsArray(a) || cJSON_GetArraySize(a) > SAMPLING_BIAS_MAX)
        return error_set(err, ERR_PROTOCOL, "sampling.logit_bias: an array of at most %d [id, bias]",
                         SAMPLING_BIAS_MAX);
    const cJSON *e = NULL;
    cJSON_ArrayForEach(e, a) {
        const cJSON *id = cJSON_GetArrayItem(e, 0), *b = cJSON_GetArrayItem(e, 1);
        if (cJSON_GetArraySize(e) != 2 || !cJSON_IsNumber(id) || !cJSON_IsNumber(b) ||
            id->valuedouble < 0 || id->valuedouble > INT32_MAX || id->valuedouble != (int32_t)id->valuedouble)
            return error_set(err, ERR_PROTOCOL, "sampling.logit_bias[%d]: must be [id, bias]", c->n_bias);
        c->bias_ids[c->n_bias] = (int32_t)id->valuedouble;
        c->bias[c->n_bias++] = (float)b->valuedouble;
    }
    return 0;
}

/* The controls of a "sampling" object; validated as the coordinator does. */
static int get_controls(const cJSON *s, struct sampling_controls *c, char *err)
{
    double pr, fr, rep;
    char inner[ERR_MSG_MAX];
    int rc;
    if ((rc = protocol_get_double_opt(s, "sampling.presence_penalty", -SAMPLING_PENALTY_ABS_MAX,
                                      SAMPLING_PENALTY_ABS_MAX, 0.0, &pr, err)) ||
        (rc = protocol_get_double_opt(s, "sampling.frequency_penalty", -SAMPLING_PENALTY_ABS_MAX,
                                      SAMPLING_PENALTY_ABS_MAX, 0.0, &fr, err)) ||
        (rc = protocol_get_double_opt(s, "sampling.repetition_penalty", 0.0, SAMPLING_REPETITION_MAX,
                                      1.0, &rep, err)) ||
        (rc = get_bias(s, c, err)))
        return rc;
    c->presence_penalty = (float)pr;
    c->frequency_penalty = (float)fr;
    c->repetition_penalty = (float)rep;
    if (sampling_controls_validate(c, inner) != 0)
        return error_set(err, ERR_PROTOCOL, "sampling.%s", inner);
    return 0;
}

static bool add_sampling(cJSON *h, const struct worker_msg_sampling *s)
{
    cJSON *o = cJSON_AddObjectToObject(h, "sampling");
    return o && add_controls(o, &s->ctl) && cJSON_AddNumberToObject(o, "temperature", s->sp.temperature) &&
           cJSON_AddNumberToObject(o, "top_k", s->sp.top_k) &&
           cJSON_AddNumberToObject(o, "top_p", s->sp.top_p) &&
           cJSON_AddNumberToObject(o, "min_p", s->sp.min_p) &&
           add_seed(o, s->sp.seed) &&
           cJSON_AddStringToObject(h, "mode", s->mode == SPECULATE_MODE_POINT_MASS ? "point_mass"
                                                                                  : "sampled");
}

/* The optional "sampling" object over greedy defaults and the optional
 * "mode" ("sampled" by default). */
static int get_sampling(const cJSON *h, struct worker_msg_sampling *out, char *err)
{
    struct sampling_params *sp = &out->sp;
    sampling_params_default(sp);
    out->mode = SPECULATE_MODE_SAMPLED;
    const cJSON *s = NULL;
    int rc = protocol_get_object_opt(h, "sampling", &s, err);
    if (rc)
        return rc;
    if (s) {
        double t, p, mp;
        int top_k;
        char inner[ERR_MSG_MAX];
        if ((rc = protocol_get_double_opt(s, "sampling.temperature", 0.0, SAMPLING_TEMPERATURE_MAX,
                                          0.0, &t, err)) ||
            (rc = protocol_get_int_opt(s, "sampling.top_k", 0, SAMPLING_TOP_K_MAX, 0, &top_k, err)) ||
            (rc = protocol_get_double_opt(s, "sampling.top_p", 0.0, 1.0, 1.0, &p, err)) ||
            (rc = protocol_get_double_opt(s, "sampling.min_p", 0.0, 1.0, 0.0, &mp, err)) ||
            (rc = get_seed(s, &sp->seed, err)) || (rc = get_controls(s, &out->ctl, err)))
            return rc;
        /* the same check as the coordinator's on client requests (request.c) */
        if (sampling_params_set(sp, t, top_k, p, mp, inner) != 0)
            return error_set(err, ERR_PROTOCOL, "sampling.%s", inner);
    }
    const char *m = NULL;
    if ((rc = protocol_get_string_opt(h, "mode", 32, "sampled", &m, err)))
        return rc;
    if (strcmp(m, "sampled") == 0)
        out->mode = SPECULATE_MODE_SAMPLED;
    else if (strcmp(m, "point_mass") == 0)
        out->mode = SPECULATE_MODE_POINT_MASS;
    else
        return error_set(err, ERR_PROTOCOL, "mode: must be \"sampled\" or \"point_mass\", got \"%.32s\"",
                         m);
    return 0;
}

static void set_frame(struct protocol_frame *f, const int32_t *tokens, int n)
{
    f->data = tokens;
    f->size_bytes = (size_t)n * sizeof(int32_t);
}

/* A header whose building failed part-way is deleted: NULL means "out of
 * memory" to every sender. */
static cJSON *finish(cJSON *h, bool ok)
{
    if (!ok) {
        cJSON_Delete(h);
        return NULL;
    }
    return h;
}

static int max_int(int a, int b)
{
    return a > b ? a : b;
}

/* "logprobs": N of a target command, absent when off. */
static bool add_logprobs_ask(cJSON *h, const struct worker_msg_logprobs *lp)
{
    return !lp->on || cJSON_AddNumberToObject(h, "logprobs", lp->top);
}

static int get_logprobs_ask(const cJSON *h, struct worker_msg_logprobs *lp, char *err)
{
    int top = -1;
    int rc = protocol_get_int_opt(h, "logprobs", 0, SAMPLING_TOP_LOGPROBS_MAX, -1, &top, err);
    lp->on = rc == 0 && top >= 0;
    lp->top = lp->on ? top : 0;
    return rc;
}

/* ---- prefill ---- */

static bool add_grammar(cJSON *h, const cJSON *grammar)
{
    if (!grammar)
        return true;
    cJSON *g = cJSON_Duplicate(grammar, 1);
    if (g && cJSON_AddItemToObject(h, "grammar", g))
        return true;
    cJSON_Delete(g);
    return false;
}

cJSON *worker_msg_prefill_encode(const struct worker_msg_prefill *m, struct protocol_frame *frame)
{
    cJSON *h = protocol_header_new(PROTOCOL_PREFILL);
    set_frame(frame, m->prompt, m->n_prompt);
    return finish(h, h && add_seq(h, &m->seq) && add_sampling(h, &m->sampling) &&
                         (m->round == 0 || cJSON_AddNumberToObject(h, "round", (double)m->round)) &&
                         add_logprobs_ask(h, &m->logprobs) && add_grammar(h, m->grammar));
}

int worker_msg_prefill_decode(const struct protocol_msg *msg, const struct worker_msg_limits *lim,
                              struct worker_msg_prefill *m, char *err)
{
    memset(m, 0, sizeof *m);
    int rc;
    if ((rc = get_seq(msg->header, lim, &m->seq, err)) ||
        (rc = get_sampling(msg->header, &m->sampling, err)) ||
        (rc = protocol_get_i64_opt(msg->header, "round", 0, UINT32_MAX, 0, &m->round, err)) ||
        (rc = get_logprobs_ask(msg->header, &m->logprobs, err)) ||
        (rc = protocol_get_object_opt(msg->header, "grammar", &m->grammar, err)))
        return rc;
    return protocol_frame_tokens(msg, 0, "prompt", 1, max_int(lim->max_seq_len, 1), &m->prompt,
                                 &m->n_prompt, err);
}

static bool add_prefix(cJSON *h, const struct worker_msg_prefix *p)
{
    if (!p->present)
        return true;
    cJSON *o = cJSON_AddObjectToObject(h, "prefix");
    return o && cJSON_AddNumberToObject(o, "looked_up", p->looked_up) &&
           cJSON_AddNumberToObject(o, "cached", p->cached) &&
           cJSON_AddNumberToObject(o, "cached_blocks", p->cached_blocks) &&
           cJSON_AddNumberToObject(o, "evictions", (double)p->evictions);
}

static int get_prefix(const cJSON *h, const struct worker_msg_limits *lim, struct worker_msg_prefix *p,
                      char *err)
{
    const cJSON *o = NULL;
    int rc = protocol_get_object_opt(h, "prefix", &o, err);
    if (rc || o == NULL)
        return rc;
    p->present = true;
    const int max_len = lim->max_seq_len > 0 ? lim->max_seq_len : INT32_MAX;
    if ((rc = protocol_get_int(o, "looked_up", 0, max_len, &p->looked_up, err)) ||
        (rc = protocol_get_int(o, "cached", 0, p->looked_up, &p->cached, err)) ||
        (rc = protocol_get_int(o, "cached_blocks", 0, INT32_MAX, &p->cached_blocks, err)) ||
        (rc = protocol_get_i64(o, "evictions", 0, (int64_t)1 << 52, &p->evictions, err)))
        return rc;
    return 0;
}

cJSON *worker_msg_prefill_done_encode(const struct worker_msg_prefill_done *m)
{
    cJSON *h = protocol_header_new(PROTOCOL_PREFILL_DONE);
    return finish(h, h && add_seq(h, &m->seq) &&
                         cJSON_AddNumberToObject(h, "prefill_ms", m->prefill_ms) &&
                         add_prefix(h, &m->prefix));
}

int worker_msg_prefill_done_decode(const struct protocol_msg *msg,
                                   const struct worker_msg_limits *lim,
                                   struct worker_msg_prefill_done *m, char *err)
{
    memset(m, 0, sizeof *m);
    int rc;
    if ((rc = get_seq(msg->header, lim, &m->seq, err)) ||
        (rc = protocol_get_double_opt(msg->header, "prefill_ms", 0, 1e12, 0, &m->prefill_ms, err)))
        return rc;
    return get_prefix(msg->header, lim, &m->prefix, err);
}

/* ---- draft ---- */

cJSON *worker_msg_draft_encode(const struct worker_msg_draft *m, struct protocol_frame *frame)
{
    cJSON *h = protocol_header_new(PROTOCOL_DRAFT);
    set_frame(frame, m->feed, m->n_feed);
    return finish(h, h && add_seq(h, &m->seq) && add_sampling(h, &m->sampling) &&
                         cJSON_AddNumberToObject(h, "half", m->half) &&
                         cJSON_AddNumberToObject(h, "round", (double)m->round) &&
                         cJSON_AddNumberToObject(h, "keep_len", m->keep_len) &&
                         cJSON_AddNumberToObject(h, "k", m->k) &&
                         cJSON_AddNumberToObject(h, "predraft_k", m->predraft_k));
}

int worker_msg_draft_decode(const struct protocol_msg *msg, const struct worker_msg_limits *lim,
                            struct worker_msg_draft *m, char *err)
{
    memset(m, 0, sizeof *m);
    const cJSON *h = msg->header;
    int rc;
    int k_limit = lim->k_max < SPECULATE_K_MAX ? lim->k_max : SPECULATE_K_MAX;
    /* the pre-draft proposes predraft_k + 1 tokens (guess + drafts) */
    int predraft_limit = lim->k_max < SPECULATE_K_MAX - 1 ? lim->k_max : SPECULATE_K_MAX - 1;
    if ((rc = get_seq(h, lim, &m->seq, err)) ||
        (rc = protocol_get_int(h, "half", 0, 1, &m->half, err)) ||
        (rc = protocol_get_i64(h, "round", 0, UINT32_MAX - 1, &m->round, err)) ||
        (rc = protocol_get_int(h, "keep_len", 0, lim->max_seq_len, &m->keep_len, err)) ||
        (rc = protocol_get_int(h, "k", 0, k_limit, &m->k, err)) ||
        (rc = protocol_get_int_opt(h, "predraft_k", 0, predraft_limit, 0, &m->predraft_k, err)) ||
        (rc = get_sampling(h, &m->sampling, err)))
        return rc;
    return protocol_frame_tokens(msg, 0, "feed", 1, max_int(lim->max_seq_len, 1), &m->feed,
                                 &m->n_feed, err);
}

cJSON *worker_msg_draft_ready_encode(const struct worker_msg_draft_ready *m)
{
    cJSON *h = protocol_header_new(PROTOCOL_DRAFT_READY);
    return finish(h, h && add_seq(h, &m->seq) && cJSON_AddNumberToObject(h, "half", m->half) &&
                         cJSON_AddNumberToObject(h, "round", (double)m->round) &&
                         cJSON_AddNumberToObject(h, "k", m->k) &&
                         cJSON_AddNumberToObject(h, "guess", m->guess) &&
                         cJSON_AddBoolToObject(h, "predraft", m->predraft) &&
                         cJSON_AddNumberToObject(h, "draft_ms", m->draft_ms));
}

int worker_msg_draft_ready_decode(const struct protocol_msg *msg,
                                  const struct worker_msg_limits *lim,
                                  struct worker_msg_draft_ready *m, char *err)
{
    memset(m, 0, sizeof *m);
    const cJSON *h = msg->header;
    int guess_max = lim->vocab_size > 0 ? lim->vocab_size - 1 : INT32_MAX;
    int rc;
    if ((rc = get_seq(h, lim, &m->seq, err)) ||
        (rc = protocol_get_i64(h, "round", 0, UINT32_MAX, &m->round, err)) ||
        (rc = protocol_get_int(h, "half", 0, 1, &m->half, err)) ||
        (rc = protocol_get_int(h, "k", 0, SPECULATE_K_MAX + 1, &m->k, err)) ||
        (rc = protocol_get_int_opt(h, "guess", -1, guess_max, -1, &m->guess, err)) ||
        (rc = protocol_get_bool_opt(h, "predraft", false, &m->predraft, err)))
        return rc;
    return protocol_get_double_opt(h, "draft_ms", -1, 1e12, -1, &m->draft_ms, err);
}

/* ---- the target's calls: run, verify_matched, verify_tree, verify ---- */

static bool add_target_call(cJSON *h, const struct worker_msg_target_call *c, struct protocol_frame *frame)
{
    set_frame(frame, c->feed, c->n_feed);
    return h && add_seq(h, &c->seq) && add_sampling(h, &c->sampling) &&
           cJSON_AddNumberToObject(h, "round", (double)c->round) &&
           cJSON_AddNumberToObject(h, "keep_len", c->keep_len) && add_logprobs_ask(h, &c->logprobs);
}

/* The fields every call has, in declaration order; the feed frame last
 * (after the command's own fields, so that an error names the first bad
 * field as before). */
static int get_target_call(const cJSON *h, const struct worker_msg_limits *lim, struct worker_msg_target_call *c,
                           char *err)
{
    int rc;
    if ((rc = get_seq(h, lim, &c->seq, err)) ||
        (rc = protocol_get_i64(h, "round", 0, UINT32_MAX, &c->round, err)) ||
        (rc = protocol_get_int(h, "keep_len", 0, lim->max_seq_len, &c->keep_len, err)) ||
        (rc = get_sampling(h, &c->sampling, err)))
        return rc;
    return get_logprobs_ask(h, &c->logprobs, err);
}

static int get_feed(const struct protocol_msg *msg, const struct worker_msg_limits *lim,
                    struct worker_msg_target_call *c, char *err)
{
    return protocol_frame_tokens(msg, 0, "feed", 1, max_int(lim->max_seq_len, 1), &c->feed, &c->n_feed, err);
}

/* A field that belongs to another of the target's commands: refused by
 * name, so a sender that mixes two meanings learns which. */
static int refuse_field(const cJSON *h, const char *field, const char *type, const char *belongs, char *err)
{
    if (cJSON_GetObjectItemCaseSensitive(h, field) == NULL)
        return 0;
    return error_set(err, ERR_PROTOCOL, "%s: not a field of %s (it belongs to %s)", field, type, belongs);
}

static int k_limit(const struct worker_msg_limits *lim)
{
    return lim->k_max < SPECULATE_K_MAX ? lim->k_max : SPECULATE_K_MAX;
}

cJSON *worker_msg_run_encode(const struct worker_msg_run *m, struct protocol_frame *frame)
{
    cJSON *h = protocol_header_new(PROTOCOL_RUN);
    return finish(h, add_target_call(h, &m->call, frame) &&
                         (m->steps <= 1 || cJSON_AddNumberToObject(h, "steps", m->steps)));
}

int worker_msg_run_decode(const struct protocol_msg *msg, const struct worker_msg_limits *lim,
                          struct worker_msg_run *m, char *err)
{
    memset(m, 0, sizeof *m);
    const cJSON *h = msg->header;
    int rc;
    if ((rc = get_target_call(h, lim, &m->call, err)) ||
        (rc = protocol_get_int_opt(h, "steps", 1, WORKER_MSG_STEPS_MAX, 1, &m->steps, err)) ||
        (rc = refuse_field(h, "k", PROTOCOL_RUN, "verify", err)) ||
        (rc = refuse_field(h, "drafts", PROTOCOL_RUN, "verify_matched", err)))
        return rc;
    return get_feed(msg, lim, &m->call, err);
}

cJSON *worker_msg_verify_matched_encode(const struct worker_msg_verify_matched *m,
                                        struct protocol_frame *frame)
{
    cJSON *h = protocol_header_new(PROTOCOL_VERIFY_MATCHED);
    bool ok = add_target_call(h, &m->call, frame);
    cJSON *d = ok ? cJSON_CreateIntArray(m->drafts, m->n_drafts) : NULL;
    ok = d && cJSON_AddItemToObject(h, "drafts", d);
    if (!ok)
        cJSON_Delete(d);
    return finish(h, ok);
}

int worker_msg_verify_matched_decode(const struct protocol_msg *msg, const struct worker_msg_limits *lim,
                                     struct worker_msg_verify_matched *m, char *err)
{
    memset(m, 0, sizeof *m);
    const cJSON *h = msg->header;
    const int vocab_max = lim->vocab_size > 0 ? lim->vocab_size - 1 : INT32_MAX;
    int rc;
    if ((rc = get_target_call(h, lim, &m->call, err)) ||
        (rc = protocol_get_int_array(h, "drafts", 0, vocab_max, m->drafts, SPECULATE_K_MAX, &m->n_drafts,
                                     err)) ||
        (rc = refuse_field(h, "k", PROTOCOL_VERIFY_MATCHED, "verify: the drafts' count is theirs", err)) ||
        (rc = refuse_field(h, "parents", PROTOCOL_VERIFY_MATCHED, "verify_tree", err)) ||
        (rc = refuse_field(h, "steps", PROTOCOL_VERIFY_MATCHED, "run", err)))
        return rc;
    if (m->n_drafts < 1 || m->n_drafts > k_limit(lim))
        return error_set(err, ERR_PROTOCOL, "drafts: %d of them, must be 1..%d", m->n_drafts, k_limit(lim));
    return get_feed(msg, lim, &m->call, err);
}

cJSON *worker_msg_verify_tree_encode(const struct worker_msg_verify_tree *m, struct protocol_frame *frame)
{
    cJSON *h = protocol_header_new(PROTOCOL_VERIFY_TREE);
    bool ok = add_target_call(h, &m->call, frame);
    cJSON *d = ok ? cJSON_CreateIntArray(m->drafts, m->n_nodes) : NULL;
    ok = d && cJSON_AddItemToObject(h, "drafts", d);
    if (!ok)
        cJSON_Delete(d);
    cJSON *p = ok ? cJSON_CreateIntArray(m->parents, m->n_nodes) : NULL;
    ok = p && cJSON_AddItemToObject(h, "parents", p);
    if (!ok)
        cJSON_Delete(p);
    return finish(h, ok);
}

/* The tree's shape: each parent -1 or an earlier node, no root path
 * deeper than k_max (verify_done carries at most that many accepted). */
static int check_tree(const struct worker_msg_verify_tree *m, const struct worker_msg_limits *lim, char *err)
{
    int depth[WORKER_MSG_TREE_NODES_MAX];
    for (int i = 0; i < m->n_nodes; i++) {
        const int p = m->parents[i];
        if (p < -1 || p >= m->n_nodes)
            return error_set(err, ERR_PROTOCOL, "parents[%d]: %d is out of range (-1..%d)", i, p, m->n_nodes - 1);
        if (p >= i)
            return error_set(err, ERR_PROTOCOL, "parents[%d]: %d is not before its child (-1..%d)", i, p, i - 1);
        depth[i] = p < 0 ? 1 : depth[p] + 1;
        if (depth[i] > k_limit(lim))
            return error_set(err, ERR_PROTOCOL, "parents[%d]: node %d is %d deep, more than k_max %d", i, i,
                             depth[i], k_limit(lim));
    }
    return 0;
}

int worker_msg_verify_tree_decode(const struct protocol_msg *msg, const struct worker_msg_limits *lim,
                                  struct worker_msg_verify_tree *m, char *err)
{
    memset(m, 0, sizeof *m);
    const cJSON *h = msg->header;
    const int vocab_max = lim->vocab_size > 0 ? lim->vocab_size - 1 : INT32_MAX;
    int n_parents = 0, rc;
    if ((rc = get_target_call(h, lim, &m->call, err)) ||
        (rc = protocol_get_int_array(h, "drafts", 0, vocab_max, m->drafts, WORKER_MSG_TREE_NODES_MAX,
                                     &m->n_nodes, err)) ||
        (rc = protocol_get_int_array(h, "parents", INT32_MIN, INT32_MAX, m->parents, WORKER_MSG_TREE_NODES_MAX,
                                     &n_parents, err)) ||
        (rc = refuse_field(h, "k", PROTOCOL_VERIFY_TREE, "verify: the nodes' count is theirs", err)) ||
        (rc = refuse_field(h, "steps", PROTOCOL_VERIFY_TREE, "run", err)))
        return rc;
    if (m->n_nodes < 1)
        return error_set(err, ERR_PROTOCOL, "drafts: none, a tree needs 1..%d nodes", WORKER_MSG_TREE_NODES_MAX);
    if (n_parents != m->n_nodes)
        return error_set(err, ERR_PROTOCOL, "parents: %d of them for %d drafts (one per node)", n_parents,
                         m->n_nodes);
    if ((rc = check_tree(m, lim, err)))
        return rc;
    return get_feed(msg, lim, &m->call, err);
}

cJSON *worker_msg_verify_encode(const struct worker_msg_verify *m, struct protocol_frame *frame)
{
    cJSON *h = protocol_header_new(PROTOCOL_VERIFY);
    bool ok = add_target_call(h, &m->call, frame) && cJSON_AddNumberToObject(h, "k", m->k) &&
              cJSON_AddNumberToObject(h, "half", m->half) &&
              (!m->await_draft || cJSON_AddBoolToObject(h, "await_draft", true));
    if (ok && m->shm) {
        cJSON *shm = cJSON_Duplicate(m->shm, 1);
        ok = shm && cJSON_AddItemToObject(h, "shm", shm);
        if (!ok)
            cJSON_Delete(shm);
    }
    return finish(h, ok);
}

int worker_msg_verify_decode(const struct protocol_msg *msg, const struct worker_msg_limits *lim,
                             struct worker_msg_verify *m, char *err)
{
    memset(m, 0, sizeof *m);
    const cJSON *h = msg->header;
    int rc;
    if ((rc = get_target_call(h, lim, &m->call, err)) ||
        (rc = protocol_get_int(h, "k", 1, k_limit(lim), &m->k, err)) ||
        (rc = protocol_get_int(h, "half", 0, 1, &m->half, err)) ||
        (rc = protocol_get_object_opt(h, "shm", &m->shm, err)) ||
        (rc = protocol_get_bool_opt(h, "await_draft", false, &m->await_draft, err)) ||
        (rc = refuse_field(h, "steps", PROTOCOL_VERIFY, "run", err)) ||
        (rc = refuse_field(h, "drafts", PROTOCOL_VERIFY, "verify_matched", err)))
        return rc;
    return get_feed(msg, lim, &m->call, err);
}

/* "logprobs" of verify_done (worker_msg.h): [[lp, id, lp, id, lp...], ...]. */
static bool add_logprobs(cJSON *h, const struct worker_msg_verify_done *m)
{
    if (!m->has_logprobs)
        return true;
    cJSON *a = cJSON_AddArrayToObject(h, "logprobs");
    if (!a)
        return false;
    for (int i = 0; i < m->n_tokens; i++) {
        const struct sampling_logprobs *lp = &m->logprobs[i];
        cJSON *e = cJSON_CreateArray();
        if (!e || !cJSON_AddItemToArray(a, e)) {
            cJSON_Delete(e);
            return false;
        }
        bool ok = cJSON_AddItemToArray(e, cJSON_CreateNumber(lp->logprob));
        for (int t = 0; ok && t < lp->n_top; t++)
            ok = cJSON_AddItemToArray(e, cJSON_CreateNumber(lp->top_ids[t])) &&
                 cJSON_AddItemToArray(e, cJSON_CreateNumber(lp->top_logprobs[t]));
        if (!ok)
            return false;
    }
    return true;
}

static int get_logprob_value(const cJSON *v, int i, float *out, char *err)
{
    if (!cJSON_IsNumber(v) || !(v->valuedouble <= 0.0) || v->valuedouble < -1e30)
        return error_set(err, ERR_PROTOCOL, "logprobs[%d]: a logprob must be a number <= 0", i);
    *out = (float)v->valuedouble;
    return 0;
}

/* One token's entry of "logprobs", ids checked against the vocabulary. */
static int get_logprob_entry(const cJSON *e, int i, const struct worker_msg_limits *lim,
                             struct sampling_logprobs *lp, char *err)
{
    const int n = cJSON_IsArray(e) ? cJSON_GetArraySize(e) : 0;
    if (n < 1 || n % 2 == 0 || n > 1 + 2 * SAMPLING_TOP_LOGPROBS_MAX)
        return error_set(err, ERR_PROTOCOL,
                         "logprobs[%d]: must be [logprob, id, logprob, ...] with at most %d ids", i,
                         SAMPLING_TOP_LOGPROBS_MAX);
    const cJSON *v = e->child;
    int rc = get_logprob_value(v, i, &lp->logprob, err);
    lp->n_top = 0;
    for (v = v->next; !rc && v; v = v->next->next) {
        const double id = cJSON_IsNumber(v) ? v->valuedouble : -1;
        if (id < 0 || id != (double)(int32_t)id || (lim->vocab_size > 0 && id >= lim->vocab_size))
            return error_set(err, ERR_PROTOCOL, "logprobs[%d]: a top id outside the vocabulary", i);
        lp->top_ids[lp->n_top] = (int32_t)id;
        rc = get_logprob_value(v->next, i, &lp->top_logprobs[lp->n_top++], err);
    }
    return rc;
}

static int get_logprobs(const cJSON *h, const struct worker_msg_limits *lim,
                        struct worker_msg_verify_done *m, char *err)
{
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(h, "logprobs");
    if (!a)
        return 0;
    if (!cJSON_IsArray(a) || cJSON_GetArraySize(a) != m->n_tokens)
        return error_set(err, ERR_PROTOCOL, "logprobs: must be an array of %d entries, one a token",
                         m->n_tokens);
    m->has_logprobs = true;
    int i = 0;
    for (const cJSON *e = a->child; e; e = e->next, i++) {
        int rc = get_logprob_entry(e, i, lim, &m->logprobs[i], err);
        if (rc)
            return rc;
    }
    return 0;
}

cJSON *worker_msg_verify_done_encode(const struct worker_msg_verify_done *m,
                                     struct protocol_frame *frame)
{
    cJSON *h = protocol_header_new(PROTOCOL_VERIFY_DONE);
    set_frame(frame, m->tokens, m->n_tokens);
    return finish(h, h && add_seq(h, &m->seq) &&
                         cJSON_AddNumberToObject(h, "round", (double)m->round) &&
                         cJSON_AddNumberToObject(h, "n_accepted", m->n_accepted) &&
                         cJSON_AddNumberToObject(h, "verify_ms", m->verify_ms) &&
                         (m->idle_ms < 0 || cJSON_AddNumberToObject(h, "idle_ms", m->idle_ms)) &&
                         cJSON_AddNumberToObject(h, "draft_k", m->draft_k) &&
                         (m->step <= 1 || cJSON_AddNumberToObject(h, "step", m->step)) &&
                         (m->call <= 0 ||
                          (cJSON_AddNumberToObject(h, "call", (double)m->call) &&
                           cJSON_AddNumberToObject(h, "call_seqs", m->call_seqs) &&
                           cJSON_AddNumberToObject(h, "call_rows", m->call_rows) &&
                           cJSON_AddNumberToObject(h, "call_ms", m->call_ms))) &&
                         add_prefix(h, &m->prefix) && add_logprobs(h, m));
}

int worker_msg_verify_done_decode(const struct protocol_msg *msg,
                                  const struct worker_msg_limits *lim,
                                  struct worker_msg_verify_done *m, char *err)
{
    memset(m, 0, sizeof *m);
    const cJSON *h = msg->header;
    int rc;
    if ((rc = get_seq(h, lim, &m->seq, err)) ||
        (rc = protocol_get_i64(h, "round", 0, UINT32_MAX, &m->round, err)) ||
        (rc = protocol_get_int(h, "n_accepted", 0, SPECULATE_K_MAX, &m->n_accepted, err)) ||
        (rc = protocol_get_double_opt(h, "verify_ms", 0, 1e12, 0, &m->verify_ms, err)) ||
        (rc = protocol_get_double_opt(h, "idle_ms", -1, 1e12, -1, &m->idle_ms, err)) ||
        (rc = protocol_get_int_opt(h, "draft_k", 0, WORKER_MSG_TREE_NODES_MAX, 0, &m->draft_k, err)) ||
        (rc = protocol_get_int_opt(h, "step", 1, WORKER_MSG_STEPS_MAX, 1, &m->step, err)) ||
        (rc = protocol_get_i64_opt(h, "call", 0, (int64_t)1 << 52, 0, &m->call, err)) ||
        (rc = protocol_get_int_opt(h, "call_seqs", 0, 1 << 20, 0, &m->call_seqs, err)) ||
        (rc = protocol_get_int_opt(h, "call_rows", 0, 1 << 24, 0, &m->call_rows, err)) ||
        (rc = protocol_get_double_opt(h, "call_ms", 0, 1e12, 0, &m->call_ms, err)) ||
        (rc = get_prefix(h, lim, &m->prefix, err)) ||
        (rc = protocol_frame_tokens(msg, 0, "tokens", m->n_accepted + 1, m->n_accepted + 1,
                                    &m->tokens, &m->n_tokens, err)) ||
        (rc = get_logprobs(h, lim, m, err)))
        return rc;
    for (int i = 0; lim->vocab_size > 0 && i < m->n_tokens; i++)
        if (m->tokens[i] < 0 || m->tokens[i] >= lim->vocab_size)
            return error_set(err, ERR_PROTOCOL, "tokens[%d]: %d is outside the vocabulary (0..%d)",
                             i, m->tokens[i], lim->vocab_size - 1);
    return 0;
}

/* ---- release, error ---- */

cJSON *worker_msg_release_encode(const struct worker_msg_seq *m)
{
    cJSON *h = protocol_header_new(PROTOCOL_RELEASE);
    return finish(h, h && add_seq(h, m));
}

int worker_msg_release_decode(const struct protocol_msg *msg, const struct worker_msg_limits *lim,
                              struct worker_msg_seq *m, char *err)
{
    return get_seq(msg->header, lim, m, err);
}

cJSON *worker_msg_error_encode(const struct worker_msg_seq *seq, int code, const char *message,
                               const char *in_reply_to)
{
    char cname[32];
    snprintf(cname, sizeof cname, "%s", error_name(code));
    for (char *p = cname; *p; p++)
        if (*p >= 'A' && *p <= 'Z')
            *p = (char)(*p - 'A' + 'a');
    cJSON *h = protocol_header_new(PROTOCOL_ERROR);
    return finish(h, h && add_seq(h, seq) && cJSON_AddStringToObject(h, "code", cname) &&
                         cJSON_AddStringToObject(h, "message", message) &&
                         cJSON_AddStringToObject(h, "in_reply_to", in_reply_to));
}

void worker_msg_error_decode(const struct protocol_msg *msg, const struct worker_msg_limits *lim,
                             struct worker_msg_error *m)
{
    char ignored[ERR_MSG_MAX];
    memset(m, 0, sizeof *m);
    get_seq(msg->header, lim, &m->seq, ignored);
    if (protocol_get_string_opt(msg->header, "code", 64, "", &m->code, ignored) != 0)
        m->code = "";
    if (protocol_get_string_opt(msg->header, "message", 1024, "", &m->message, ignored) != 0)
        m->message = "";
    if (protocol_get_string_opt(msg->header, "in_reply_to", 64, "", &m->in_reply_to, ignored) != 0)
        m->in_reply_to = "";
}

/* ---- register ---- */

cJSON *worker_msg_register_encode(const struct worker_msg_register *m)
{
    cJSON *h = protocol_header_new(PROTOCOL_REGISTER);
    bool ok = h && cJSON_AddStringToObject(h, "role", m->role) &&
              cJSON_AddNumberToObject(h, "pid", m->pid) &&
              cJSON_AddStringToObject(h, "model", m->model) &&
              cJSON_AddStringToObject(h, "backend", m->backend) &&
              cJSON_AddNumberToObject(h, "vocab_size", m->vocab_size);
    cJSON *eos = ok ? cJSON_AddArrayToObject(h, "eos_ids") : NULL;
    ok = ok && eos;
    for (int i = 0; ok && i < m->n_eos; i++) {
        cJSON *v = cJSON_CreateNumber(m->eos_ids[i]);
        ok = v && cJSON_AddItemToArray(eos, v);
        if (!ok)
            cJSON_Delete(v);
    }
    ok = ok && cJSON_AddNumberToObject(h, "max_seq_len", m->max_seq_len) &&
         cJSON_AddNumberToObject(h, "n_slots", m->n_slots) &&
         cJSON_AddNumberToObject(h, "bos_id", m->bos_id) &&
         (m->kv_blocks <= 0 || (cJSON_AddNumberToObject(h, "kv_blocks", m->kv_blocks) &&
                                cJSON_AddNumberToObject(h, "kv_block_size", m->kv_block_size))) &&
         (m->drops <= 0 || cJSON_AddNumberToObject(h, "drops", m->drops)) &&
         (m->pair <= 0 || cJSON_AddNumberToObject(h, "pair", m->pair)) &&
         (m->shm_domain == NULL || m->shm_domain[0] == '\0' ||
          cJSON_AddStringToObject(h, "shm_domain", m->shm_domain));
    if (ok && m->cpu.present) {
        cJSON *cpu = cJSON_AddObjectToObject(h, "cpu");
        ok = cpu && cJSON_AddStringToObject(cpu, "host", m->cpu.host) &&
             cJSON_AddNumberToObject(cpu, "threads", m->cpu.threads) &&
             cJSON_AddStringToObject(cpu, "cpus", m->cpu.cpus);
    }
    if (ok && m->shm) {
        cJSON *shm = cJSON_Duplicate(m->shm, 1);
        ok = shm && cJSON_AddItemToObject(h, "shm", shm);
        if (!ok)
            cJSON_Delete(shm);
    }
    return finish(h, ok);
}

int worker_msg_register_decode(const struct protocol_msg *msg, struct worker_msg_register *m,
                               char *err)
{
    memset(m, 0, sizeof *m);
    const cJSON *h = msg->header;
    int rc = protocol_get_string(h, "role", 16, &m->role, err);
    if (rc)
        return rc;
    bool draft = strcmp(m->role, "draft") == 0;
    if (!draft && strcmp(m->role, "target") != 0)
        return error_set(err, ERR_PROTOCOL, "role: expected \"draft\" or \"target\", got \"%.16s\"",
                         m->role);
    if ((rc = protocol_get_int(h, "pid", 1, INT32_MAX, &m->pid, err)) ||
        (rc = protocol_get_string_opt(h, "model", WORKER_MSG_NAME_MAX - 1, "", &m->model, err)) ||
        (rc = protocol_get_string_opt(h, "backend", 63, "", &m->backend, err)) ||
        (rc = protocol_get_int(h, "vocab_size", 1, INT32_MAX, &m->vocab_size, err)) ||
        (rc = protocol_get_int_array(h, "eos_ids", 0, INT32_MAX, m->eos_ids, WORKER_MSG_EOS_MAX,
                                     &m->n_eos, err)) ||
        (rc = protocol_get_int(h, "max_seq_len", 2, INT32_MAX, &m->max_seq_len, err)) ||
        (rc = protocol_get_int(h, "n_slots", 1, 65536, &m->n_slots, err)) ||
        (rc = protocol_get_int_opt(h, "bos_id", -1, INT32_MAX, -1, &m->bos_id, err)) ||
        (rc = protocol_get_int_opt(h, "kv_blocks", 0, INT32_MAX, 0, &m->kv_blocks, err)) ||
        (rc = protocol_get_int_opt(h, "kv_block_size", m->kv_blocks > 0 ? 1 : 0, 1 << 20, 0,
                                   &m->kv_block_size, err)) ||
        (rc = protocol_get_int_opt(h, "drops", 0, INT32_MAX, 0, &m->drops, err)) ||
        (rc = protocol_get_int_opt(h, "pair", 0, PROC_CONFIG_PAIRS_MAX - 1, 0, &m->pair, err)) ||
        (rc = protocol_get_string_opt(h, "shm_domain", WORKER_MSG_SHM_DOMAIN_MAX, "", &m->shm_domain, err)))
        return rc;
    if (m->kv_blocks > 0 && m->kv_block_size < 1)
        return error_set(err, ERR_PROTOCOL, "kv_block_size: required with kv_blocks");
    const cJSON *cpu = NULL;
    if ((rc = protocol_get_object_opt(h, "cpu", &cpu, err)))
        return rc;
    if (cpu) {
        char inner[ERR_MSG_MAX];
        if ((rc = protocol_get_string(cpu, "cpu.host", WORKER_MSG_CPU_HOST_MAX, &m->cpu.host, err)) ||
            (rc = protocol_get_int(cpu, "cpu.threads", 1, 65536, &m->cpu.threads, err)) ||
            (rc = protocol_get_string(cpu, "cpu.cpus", WORKER_MSG_CPU_LIST_MAX, &m->cpu.cpus, err)))
            return rc;
        if (cpulist_parse(m->cpu.cpus, &m->cpu.set, inner) != 0)
            return error_set(err, ERR_PROTOCOL, "cpu.cpus: %s", inner);
        m->cpu.present = true;
    }
    if (draft)
        return protocol_get_object(h, "shm", &m->shm, err);
    return 0;
}
