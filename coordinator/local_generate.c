/* local_generate.c: see local_generate.h. */
#include "local_generate.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"

static double number_at(const cJSON *obj, const char *a, const char *b)
{
    const cJSON *o = cJSON_GetObjectItemCaseSensitive(obj, a);
    const double v = cJSON_GetNumberValue(b ? cJSON_GetObjectItemCaseSensitive(o, b) : o);
    return v == v ? v : 0.0; /* NaN: absent */
}

void local_stats_from_done(const cJSON *done, struct local_stats *st)
{
    memset(st, 0, sizeof *st);
    const char *finish = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(done, "finish_reason"));
    snprintf(st->finish_reason, sizeof st->finish_reason, "%s", finish ? finish : "");
    st->prompt_tokens = (int)number_at(done, "usage", "prompt_tokens");
    st->generated_tokens = (int)number_at(done, "usage", "generated_tokens");
    st->prefill_ms = number_at(done, "timing", "prefill_ms");
    st->decode_ms = number_at(done, "timing", "decode_ms");
    st->rounds = (int)number_at(done, "spec", "rounds");
    st->drafted = (int)number_at(done, "spec", "drafted");
    st->accepted = (int)number_at(done, "spec", "accepted");
    st->draft_ms = number_at(done, "spec", "draft_ms");
    st->verify_ms = number_at(done, "spec", "verify_ms");
    st->tree_rounds = (int)number_at(done, "spec", "tree_rounds");
    st->tree_nodes = (int)number_at(done, "spec", "tree_nodes");
    const cJSON *spec = cJSON_GetObjectItemCaseSensitive(done, "spec");
    const cJSON *at = cJSON_GetObjectItemCaseSensitive(spec, "accepted_at");
    int i = 0;
    for (const cJSON *e = cJSON_IsArray(at) ? at->child : NULL; e && i < SPECULATE_K_MAX; e = e->next)
        st->accepted_at[i++] = (int)cJSON_GetNumberValue(e);
}

/* The request's JSON text (docs/protocol.md), malloc'd; NULL: out of memory. */
static char *request_text(const struct local_gen_request *rq)
{
    cJSON *r = cJSON_CreateObject();
    cJSON *ids = r ? cJSON_AddArrayToObject(r, "prompt_ids") : NULL;
    bool ok = ids != NULL;
    for (int i = 0; ok && i < rq->n_prompt; i++)
        ok = cJSON_AddItemToArray(ids, cJSON_CreateNumber(rq->prompt[i]));
    const struct sampling_params *sp = &rq->sampling;
    ok = ok && cJSON_AddNumberToObject(r, "v", 1) && cJSON_AddStringToObject(r, "type", "generate") &&
         cJSON_AddNumberToObject(r, "max_tokens", rq->max_tokens) &&
         cJSON_AddNumberToObject(r, "temperature", sp->temperature) &&
         cJSON_AddNumberToObject(r, "top_k", sp->top_k) && cJSON_AddNumberToObject(r, "top_p", sp->top_p) &&
         cJSON_AddNumberToObject(r, "min_p", sp->min_p) &&
         cJSON_AddNumberToObject(r, "seed", (double)sp->seed) &&
         cJSON_AddStringToObject(r, "spec_mode", rq->mode == SPECULATE_MODE_POINT_MASS ? "point_mass" : "sampled") &&
         cJSON_AddBoolToObject(r, "ignore_eos", rq->ignore_eos);
    if (ok && rq->spec_k >= 0)
        ok = cJSON_AddNumberToObject(r, "spec_k", rq->spec_k) != NULL;
    if (ok && rq->draft)
        ok = cJSON_AddStringToObject(r, "draft", rq->draft) != NULL;
    if (ok && rq->spec_tree != 0)
        ok = (rq->spec_tree < 0 ? cJSON_AddStringToObject(r, "spec_tree", "off")
                                : cJSON_AddNumberToObject(r, "spec_tree", rq->spec_tree)) != NULL;
    char *text = ok ? cJSON_PrintUnformatted(r) : NULL;
    cJSON_Delete(r);
    return text;
}

/* What the replies said: the done reply's ids and figures, or an error's. */
struct gen_outcome {
    struct local_gen_result *res;
    bool done;
    char code[32];
    char message[ERR_MSG_MAX];
};

static int on_reply(void *user, const cJSON *reply)
{
    struct gen_outcome *o = user;
    const char *type = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(reply, "type"));
    if (type && strcmp(type, "error") == 0) {
        const char *code = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(reply, "code"));
        const char *m = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(reply, "message"));
        snprintf(o->code, sizeof o->code, "%s", code ? code : "internal");
        snprintf(o->message, sizeof o->message, "%s", m ? m : "the pipeline failed the request");
        return 0;
    }
    if (!type || strcmp(type, "done") != 0)
        return 0;
    o->done = true;
    struct local_gen_result *r = o->res;
    const cJSON *ids = cJSON_GetObjectItemCaseSensitive(reply, "ids");
    for (const cJSON *id = ids ? ids->child : NULL; id && r->n < r->cap; id = id->next)
        r->ids[r->n++] = (int32_t)cJSON_GetNumberValue(id);
    local_stats_from_done(reply, &r->st);
    return 0;
}

int local_generate(struct local *l, const struct local_gen_request *rq, struct local_gen_result *res, char *err)
{
    res->n = 0;
    memset(&res->st, 0, sizeof res->st);
    char *text = request_text(rq);
    if (!text)
        return error_set(err, ERR_NOMEM, "in-process request: out of memory");
    struct gen_outcome o = {.res = res};
    int rc = local_run(l, text, on_reply, &o, err);
    free(text);
    if (rc)
        return rc;
    if (o.code[0]) {
        const int code = strcmp(o.code, "invalid_request") == 0 ? ERR_INVALID_ARG
                         : strcmp(o.code, "context_full") == 0  ? ERR_CONTEXT_FULL
                                                                : ERR_INTERNAL;
        return error_set(err, code, "%s", o.message);
    }
    if (!o.done)
        return error_set(err, ERR_INTERNAL, "in-process request ended without a done reply");
    res->st.cost_ratio = local_cost_ratio(l);
    return 0;
}
