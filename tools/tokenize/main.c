/* tandem-tokenize: command-line front end of the tokenizer and chat template.
 *
 *   tandem-tokenize --tokenizer PATH [--bos] [--parse-special]
 *       UTF-8 text on stdin -> JSON array of ids on stdout.
 *   tandem-tokenize --tokenizer PATH --decode [--skip-special]
 *       JSON array of ids on stdin -> the decoded text, byte for byte.
 *   tandem-tokenize --tokenizer PATH --chat [--no-generation-prompt] [--date D]
 *       JSON array of {"role","content"} -> JSON array of ids. --date selects
 *       the Llama 3.1/3.2 knowledge-date system block with "Today Date: D".
 * Hidden test modes (one process for a whole corpus):
 *   --batch           stdin: JSON array of hex-encoded texts; stdout: JSON
 *                     array of id arrays (flags as above).
 *   --batch --decode  stdin: JSON array of id arrays; stdout: JSON array of
 *                     [hex of the one-shot decode, [hex of each streamed piece]].
 * PATH is a tokenizer.json or a model directory. Exit status 0, 1 on an
 * error (message on stderr), 2 on a usage error.
 */
#include "chat_template.h"
#include "detokenizer.h"
#include "error.h"
#include "tokenizer.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct opts {
    const char *path;
    const char *date;
    unsigned flags;
    int decode, skip_special, chat, gen_prompt, batch;
};

static int usage(void)
{
    fprintf(stderr, "usage: tandem-tokenize --tokenizer PATH [--bos] [--parse-special]\n"
                    "       tandem-tokenize --tokenizer PATH --decode [--skip-special]\n"
                    "       tandem-tokenize --tokenizer PATH --chat [--no-generation-prompt] [--date DATE]\n");
    return 2;
}

static int read_stdin(char **out, size_t *len_out)
{
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap + 1);
    if (!buf)
        return -1;
    for (;;) {
        if (len == cap) {
            char *nb = realloc(buf, 2 * cap + 1);
            if (!nb) {
                free(buf);
                return -1;
            }
            buf = nb;
            cap *= 2;
        }
        size_t got = fread(buf + len, 1, cap - len, stdin);
        len += got;
        if (got == 0)
            break;
    }
    if (ferror(stdin)) {
        free(buf);
        return -1;
    }
    buf[len] = '\0';
    *out = buf;
    *len_out = len;
    return 0;
}

static void print_ids(const int32_t *ids, size_t n)
{
    putchar('[');
    for (size_t i = 0; i < n; i++)
        printf(i ? ",%d" : "%d", ids[i]);
    putchar(']');
}

static void print_hex(const char *s, size_t n)
{
    static const char hx[] = "0123456789abcdef";
    putchar('"');
    for (size_t i = 0; i < n; i++) {
        putchar(hx[(unsigned char)s[i] >> 4]);
        putchar(hx[(unsigned char)s[i] & 15]);
    }
    putchar('"');
}

static int unhex(const char *h, char *out, size_t *n_out)
{
    size_t n = strlen(h);
    if (n % 2)
        return -1;
    for (size_t i = 0; i < n; i += 2) {
        int v = 0;
        for (int k = 0; k < 2; k++) {
            char c = h[i + k];
            int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
            if (d < 0)
                return -1;
            v = v * 16 + d;
        }
        out[i / 2] = (char)v;
    }
    *n_out = n / 2;
    return 0;
}

/* Parses a JSON array of token ids. */
static int parse_ids(const cJSON *arr, int32_t **ids_out, size_t *n_out, char *err)
{
    if (!cJSON_IsArray(arr))
        return error_set(err, ERR_INVALID_ARG, "input: expected a JSON array of token ids");
    size_t n = (size_t)cJSON_GetArraySize(arr), i = 0;
    int32_t *ids = malloc((n ? n : 1) * sizeof *ids);
    if (!ids)
        return error_set(err, ERR_NOMEM, "out of memory");
    const cJSON *it;
    cJSON_ArrayForEach(it, arr) {
        double d = cJSON_IsNumber(it) ? it->valuedouble : 0.5;
        if (d != (double)(long long)d || d < INT32_MIN || d > INT32_MAX) {
            free(ids);
            return error_set(err, ERR_INVALID_ARG, "input[%zu]: expected an integer token id", i);
        }
        ids[i++] = (int32_t)d;
    }
    *ids_out = ids;
    *n_out = n;
    return 0;
}

static int run_encode(const struct tokenizer *tk, const struct opts *o, const char *in, size_t len, char *err)
{
    int32_t *ids;
    size_t n;
    int rc = tokenizer_encode(tk, in, len, o->flags, &ids, &n, err);
    if (rc)
        return rc;
    print_ids(ids, n);
    putchar('\n');
    free(ids);
    return 0;
}

static int run_decode(const struct tokenizer *tk, const struct opts *o, const cJSON *arr, char *err)
{
    int32_t *ids;
    size_t n;
    char *text;
    size_t len;
    int rc = parse_ids(arr, &ids, &n, err);
    if (rc)
        return rc;
    rc = tokenizer_decode(tk, ids, n, o->skip_special, &text, &len, err);
    free(ids);
    if (rc)
        return rc;
    if (fwrite(text, 1, len, stdout) != len)
        rc = error_set(err, ERR_IO, "stdout: write failed");
    free(text);
    return rc;
}

static int run_chat(const struct tokenizer *tk, const struct opts *o, const cJSON *arr, char *err)
{
    if (!cJSON_IsArray(arr))
        return error_set(err, ERR_INVALID_ARG, "input: expected a JSON array of {\"role\",\"content\"} messages");
    size_t n = (size_t)cJSON_GetArraySize(arr), i = 0;
    struct chat_message *msgs = calloc(n ? n : 1, sizeof *msgs);
    if (!msgs)
        return error_set(err, ERR_NOMEM, "out of memory");
    const cJSON *it;
    cJSON_ArrayForEach(it, arr) {
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(it, "role");
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(it, "content");
        if (!cJSON_IsString(role) || !cJSON_IsString(content)) {
            free(msgs);
            return error_set(err, ERR_INVALID_ARG, "messages[%zu]: role and content must be strings", i);
        }
        msgs[i].role = role->valuestring;
        msgs[i].content = content->valuestring;
        msgs[i].content_len = strlen(content->valuestring);
        i++;
    }
    struct chat_template_options copts = {.date_string = o->date};
    int32_t *ids;
    size_t n_ids;
    int rc = chat_template_encode(tk, msgs, n, o->gen_prompt, &copts, &ids, &n_ids, err);
    free(msgs);
    if (rc)
        return rc;
    print_ids(ids, n_ids);
    putchar('\n');
    free(ids);
    return 0;
}

static int run_batch_encode(const struct tokenizer *tk, const struct opts *o, const cJSON *arr, char *err)
{
    if (!cJSON_IsArray(arr))
        return error_set(err, ERR_INVALID_ARG, "input: expected a JSON array of hex strings");
    putchar('[');
    const cJSON *it;
    size_t i = 0;
    cJSON_ArrayForEach(it, arr) {
        if (!cJSON_IsString(it))
            return error_set(err, ERR_INVALID_ARG, "input[%zu]: expected a hex string", i);
        char *text = malloc(strlen(it->valuestring) / 2 + 1);
        size_t len;
        if (!text)
            return error_set(err, ERR_NOMEM, "out of memory");
        if (unhex(it->valuestring, text, &len)) {
            free(text);
            return error_set(err, ERR_INVALID_ARG, "input[%zu]: invalid hex", i);
        }
        int32_t *ids;
        size_t n;
        char inner[ERR_MSG_MAX];
        int rc = tokenizer_encode(tk, text, len, o->flags, &ids, &n, inner);
        free(text);
        if (rc)
            return error_set(err, rc, "input[%zu]: %s", i, inner);
        if (i)
            putchar(',');
        print_ids(ids, n);
        free(ids);
        i++;
    }
    puts("]");
    return 0;
}

static int run_batch_decode(const struct tokenizer *tk, const struct opts *o, const cJSON *arr, char *err)
{
    if (!cJSON_IsArray(arr))
        return error_set(err, ERR_INVALID_ARG, "input: expected a JSON array of id arrays");
    struct detokenizer *dt;
    int rc = detokenizer_create(&dt, tk, o->skip_special, err);
    if (rc)
        return rc;
    putchar('[');
    const cJSON *it;
    size_t k = 0;
    cJSON_ArrayForEach(it, arr) {
        int32_t *ids;
        size_t n;
        char *text;
        size_t len;
        if ((rc = parse_ids(it, &ids, &n, err)))
            break;
        if ((rc = tokenizer_decode(tk, ids, n, o->skip_special, &text, &len, err))) {
            free(ids);
            break;
        }
        printf(k++ ? ",[" : "[");
        print_hex(text, len);
        free(text);
        printf(",[");
        for (size_t i = 0; i <= n && !rc; i++) {
            const char *piece;
            size_t pl;
            rc = i < n ? detokenizer_push(dt, ids[i], &piece, &pl, err) : detokenizer_flush(dt, &piece, &pl, err);
            if (!rc) {
                if (i)
                    putchar(',');
                print_hex(piece, pl);
            }
        }
        printf("]]");
        free(ids);
        if (rc)
            break;
    }
    puts("]");
    detokenizer_destroy(dt);
    return rc;
}

int main(int argc, char **argv)
{
    struct opts o = {.gen_prompt = 1};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--tokenizer") == 0 && i + 1 < argc)
            o.path = argv[++i];
        else if (strcmp(a, "--date") == 0 && i + 1 < argc)
            o.date = argv[++i];
        else if (strcmp(a, "--bos") == 0)
            o.flags |= TOKENIZER_ADD_BOS;
        else if (strcmp(a, "--parse-special") == 0)
            o.flags |= TOKENIZER_PARSE_SPECIAL;
        else if (strcmp(a, "--decode") == 0)
            o.decode = 1;
        else if (strcmp(a, "--skip-special") == 0)
            o.skip_special = 1;
        else if (strcmp(a, "--chat") == 0)
            o.chat = 1;
        else if (strcmp(a, "--no-generation-prompt") == 0)
            o.gen_prompt = 0;
        else if (strcmp(a, "--batch") == 0)
            o.batch = 1;
        else
            return usage();
    }
    if (!o.path || (o.decode && o.chat))
        return usage();
    char err[ERR_MSG_MAX] = "";
    struct tokenizer *tk = NULL;
    char *in = NULL;
    size_t len = 0;
    cJSON *json = NULL;
    int rc = tokenizer_load(&tk, o.path, err);
    if (rc)
        goto out;
    if (read_stdin(&in, &len)) {
        rc = error_set(err, ERR_IO, "stdin: read failed");
        goto out;
    }
    if (!o.decode && !o.chat && !o.batch) {
        rc = run_encode(tk, &o, in, len, err);
        goto out;
    }
    json = cJSON_ParseWithLength(in, len);
    if (!json) {
        rc = error_set(err, ERR_INVALID_ARG, "stdin: malformed JSON");
        goto out;
    }
    if (o.batch)
        rc = o.decode ? run_batch_decode(tk, &o, json, err) : run_batch_encode(tk, &o, json, err);
    else if (o.decode)
        rc = run_decode(tk, &o, json, err);
    else
        rc = run_chat(tk, &o, json, err);
out:
    if (fflush(stdout) != 0 && !rc)
        rc = error_set(err, ERR_IO, "stdout: write failed");
    if (rc)
        fprintf(stderr, "tandem-tokenize: %s\n", err[0] ? err : error_str(rc));
    cJSON_Delete(json);
    free(in);
    tokenizer_destroy(tk);
    return rc ? 1 : 0;
}
