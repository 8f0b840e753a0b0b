/* grammar_spec.c: a request's grammar in its travelling form (contracts in
 * grammar_spec.h). */
#include "grammar_spec.h"

#include "error.h"
#include "grammar_gbnf.h"
#include "grammar_match.h"
#include "grammar_schema.h"
#include "json_type.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *grammar_spec_kind_name(enum grammar_spec_kind kind)
{
    switch (kind) {
    case GRAMMAR_SPEC_GBNF: return "gbnf";
    case GRAMMAR_SPEC_JSON_SCHEMA: return "json_schema";
    case GRAMMAR_SPEC_JSON_OBJECT: return "json_object";
    default: return "none";
    }
}

static int only_keys(const cJSON *item, const char *field, const char *a, const char *b, char *err)
{
    const cJSON *f = NULL;
    cJSON_ArrayForEach(f, item) {
        if (!f->string || (strcmp(f->string, "type") != 0 && !(a && strcmp(f->string, a) == 0) &&
                           !(b && strcmp(f->string, b) == 0)))
            return error_set(err, ERR_INVALID_ARG, "%s.%.64s: unknown field", field,
                             f->string ? f->string : "");
    }
    return 0;
}

static int take_text(struct grammar_spec *out, const char *text, size_t len, const char *field,
                     char *err)
{
    out->text = malloc(len + 1);
    if (!out->text)
        return error_set(err, ERR_NOMEM, "%s: out of memory", field);
    memcpy(out->text, text, len);
    out->text[len] = '\0';
    out->len = len;
    return 0;
}

int grammar_spec_from_json(struct grammar_spec *out, const cJSON *item, const char *field,
                           int wire_form, char *err)
{
    *out = (struct grammar_spec){0};
    if (!cJSON_IsObject(item))
        return error_set(err, ERR_INVALID_ARG, "%s: expected an object, got %s", field,
                         json_type_name(item));
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(item, "type");
    if (!cJSON_IsString(type))
        return error_set(err, ERR_INVALID_ARG,
                         "%s.type: required, one of \"gbnf\", \"json_schema\", \"json_object\"", field);
    const cJSON *text = cJSON_GetObjectItemCaseSensitive(item, "text");
    int rc = 0;
    if (strcmp(type->valuestring, "gbnf") == 0) {
        if ((rc = only_keys(item, field, "text", NULL, err)))
            return rc;
        if (!cJSON_IsString(text))
            return error_set(err, ERR_INVALID_ARG, "%s.text: required, the grammar as a string", field);
        size_t len = strlen(text->valuestring);
        if (len > GRAMMAR_GBNF_TEXT_MAX)
            return error_set(err, ERR_INVALID_ARG, "%s.text: at most %d bytes, got %zu", field,
                             GRAMMAR_GBNF_TEXT_MAX, len);
        out->kind = GRAMMAR_SPEC_GBNF;
        return take_text(out, text->valuestring, len, field, err);
    }
    if (strcmp(type->valuestring, "json_schema") == 0) {
        if ((rc = only_keys(item, field, "schema", wire_form ? "text" : NULL, err)))
            return rc;
        const cJSON *schema = cJSON_GetObjectItemCaseSensitive(item, "schema");
        out->kind = GRAMMAR_SPEC_JSON_SCHEMA;
        if (wire_form && cJSON_IsString(text) && !schema)
            return take_text(out, text->valuestring, strlen(text->valuestring), field, err);
        if (!cJSON_IsObject(schema) && !cJSON_IsBool(schema)) {
            out->kind = GRAMMAR_SPEC_NONE;
            return error_set(err, ERR_INVALID_ARG, "%s.schema: required, a JSON schema (object), got %s",
                             field, schema ? json_type_name(schema) : "nothing");
        }
        char *printed = cJSON_PrintUnformatted(schema);
        if (!printed) {
            out->kind = GRAMMAR_SPEC_NONE;
            return error_set(err, ERR_NOMEM, "%s: out of memory", field);
        }
        out->text = printed;
        out->len = strlen(printed);
        return 0;
    }
    if (strcmp(type->valuestring, "json_object") == 0) {
        if ((rc = only_keys(item, field, NULL, NULL, err)))
            return rc;
        out->kind = GRAMMAR_SPEC_JSON_OBJECT;
        return 0;
    }
    return error_set(err, ERR_INVALID_ARG,
                     "%s.type: must be \"gbnf\", \"json_schema\" or \"json_object\", got \"%.64s\"",
                     field, type->valuestring);
}

cJSON *grammar_spec_to_json(const struct grammar_spec *s)
{
    cJSON *o = cJSON_CreateObject();
    if (!o || !cJSON_AddStringToObject(o, "type", grammar_spec_kind_name(s->kind)) ||
        (s->text && !cJSON_AddStringToObject(o, "text", s->text))) {
        cJSON_Delete(o);
        return NULL;
    }
    return o;
}

int grammar_spec_compile(const struct grammar_spec *s, const char *where, struct grammar **out,
                         char *err)
{
    *out = NULL;
    switch (s->kind) {
    case GRAMMAR_SPEC_GBNF:
        return grammar_gbnf_parse(s->text, s->len, out, err);
    case GRAMMAR_SPEC_JSON_SCHEMA: {
        char path[128];
        snprintf(path, sizeof path, "%s.schema", where);
        return grammar_schema_compile_text(s->text, s->len, path, out, err);
    }
    case GRAMMAR_SPEC_JSON_OBJECT:
        return grammar_schema_any_object(out, err);
    default:
        return error_set(err, ERR_INVALID_ARG, "%s: no grammar", where);
    }
}

int grammar_spec_check(const struct grammar_spec *s, const char *where, char *err)
{
    struct grammar *g = NULL;
    int rc = grammar_spec_compile(s, where, &g, err);
    struct grammar_engine *e = NULL;
    if (!rc)
        rc = grammar_engine_create(&e, g, 0, err); /* takes g */
    if (!rc) {
        int32_t st = grammar_engine_start(e);
        if (grammar_engine_row(e, st, &rc, err) == NULL && rc == 0)
            rc = ERR_NOMEM;
    }
    grammar_engine_destroy(e);
    return rc;
}

uint64_t grammar_spec_hash(const struct grammar_spec *s)
{
    uint64_t h = 1469598103934665603ULL;
    h = (h ^ (uint64_t)s->kind) * 1099511628211ULL;
    for (size_t i = 0; s->text && i < s->len; i++)
        h = (h ^ (uint8_t)s->text[i]) * 1099511628211ULL;
    return h;
}

int grammar_spec_equal(const struct grammar_spec *a, const struct grammar_spec *b)
{
    return a->kind == b->kind && a->len == b->len &&
           (a->len == 0 || memcmp(a->text, b->text, a->len) == 0);
}

int grammar_spec_copy(struct grammar_spec *dst, const struct grammar_spec *src)
{
    *dst = (struct grammar_spec){.kind = src->kind};
    if (!src->text)
        return 0;
    return take_text(dst, src->text, src->len, "grammar", NULL);
}

void grammar_spec_free(struct grammar_spec *s)
{
    if (!s)
        return;
    free(s->text);
    *s = (struct grammar_spec){0};
}
