/* main.c: tandem-client, the command-line client of the coordinator.
 *
 *   tandem-client [--endpoint E] (--prompt TEXT | --chat TEXT | --ids 1,2,3)
 *                 [--max-tokens N] [--temperature T] [--top-k K] [--top-p P]
 *                 [--min-p P] [--seed S] [--stop STR]... [--spec-k K]
 *                 [--spec-mode sampled|point_mass] [--draft-source SOURCE] [--logprobs N]
 *                 [--presence-penalty X] [--frequency-penalty X] [--repetition-penalty X]
 *                 [--grammar-file FILE | --json-schema FILE | --json-object]
 *                 [--n N] [--stream] [--json]
 *                 [--timeout-ms N] [--cancel-after-ms N]
 *   tandem-client [--endpoint E] --stats [--prometheus] [--timeout-ms N]
 *
 * Exit status: 0 success, 1 the coordinator answered with an error (code
 * and message on stderr), 2 bad command line, 3 timeout or transport error.
 * --json prints one JSON object with the fields of `tandem-generate --json`
 * (ids, text, prompt_tokens, generated_tokens, prefill_ms, decode_ms,
 * tokens_per_s, acceptance_rate, rounds, mean_accepted_per_round, draft_ms,
 * verify_ms) plus the coordinator's timing and speculation counters, and
 * with --logprobs N the done reply's "logprobs" entries.
 * --n N (2..16) asks for N choices from the one prompt (not with --stream):
 * their texts are printed in index order once all have ended, each after a
 * "[choice I]" line (with --json: one object per choice, with "index").
 * Cancellation: --cancel-after-ms N sends a "cancel" N ms after the request;
 * the request then ends with the coordinator's "cancelled" error (exit
 * status 1). SIGINT / SIGTERM (Ctrl-C) send one too and exit 130 once it is
 * answered, or after 1 s, or at a second signal, or at once when no
 * coordinator was ever reached. Nothing answering at the endpoint within
 * 2 s is "no coordinator at E" (exit status 3).
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "curve_keys.h"
#include "error.h"
#include "tandem_client.h"

#define CLIENT_IDS_MAX 1000000
/* How often the receive loop looks at the cancel triggers. */
#define CLIENT_POLL_SLICE_MS 50
/* With no handshake by then, nothing listens at the endpoint: a coordinator
 * on the same host or network answers in milliseconds. */
#define CLIENT_CONNECT_WAIT_MS 2000
/* After Ctrl-C (or SIGTERM), how long the cancelled reply is waited for
 * before the client exits anyway; a second signal exits at once. */
#define CLIENT_CANCEL_WAIT_MS 1000
/* Exit status after an interrupt: 128 + SIGINT, as shells report it. */
#define CLIENT_EXIT_INTERRUPTED 130

static double monotonic_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static volatile sig_atomic_t g_interrupted; /* how many SIGINT / SIGTERM came */

static void on_signal(int signo)
{
    (void)signo;
    if (g_interrupted < 2)
        g_interrupted++;
}

/* 0 while the client has reached a coordinator or may still; otherwise
 * says "no coordinator at E" and returns 3. t_start: when the first
 * message was sent. */
static int check_connected(struct tandem_client *client, const char *endpoint, double t_start)
{
    char err[ERR_MSG_MAX];
    bool connected = false;
    if (tandem_client_has_connected(client, &connected, err) != 0) {
        fprintf(stderr, "tandem-client: %s\n", err);
        return 3;
    }
    if (connected || monotonic_ms() - t_start < CLIENT_CONNECT_WAIT_MS)
        return 0;
    fprintf(stderr,
            "tandem-client: no coordinator at %s: nothing answered within %d ms (is it running? is the "
            "endpoint right? --endpoint, default %s)\n",
            endpoint, CLIENT_CONNECT_WAIT_MS, TANDEM_CLIENT_DEFAULT_ENDPOINT);
    return 3;
}

/* The request's "grammar" (one of --grammar-file, --json-schema,
 * --json-object): the file's text as the grammar or, parsed, as the
 * schema. The coordinator compiles it and names what is wrong. */
static int set_grammar(cJSON **grammar, const char *type, const char *flag, const char *path)
{
    if (*grammar != NULL) {
        fprintf(stderr, "tandem-client: give at most one of --grammar-file, --json-schema, --json-object\n");
        return -1;
    }
    char *text = NULL;
    if (path != NULL) {
        FILE *f = fopen(path, "rb");
        long n = -1;
        if (f != NULL && fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0 &&
            (text = malloc((size_t)n + 1)) != NULL && fread(text, 1, (size_t)n, f) == (size_t)n)
            text[n] = '\0';
        else {
            fprintf(stderr, "tandem-client: %s: cannot read %s: %s\n", flag, path,
                    f != NULL && !ferror(f) && text != NULL ? "short read" : strerror(errno));
            free(text);
            text = NULL;
        }
        if (f != NULL)
            fclose(f);
        if (text == NULL)
            return -1;
    }
    cJSON *g = cJSON_CreateObject();
    int ok = g != NULL && cJSON_AddStringToObject(g, "type", type) != NULL;
    if (ok && text != NULL && strcmp(type, "gbnf") == 0) {
        ok = cJSON_AddStringToObject(g, "text", text) != NULL;
    } else if (ok && text != NULL) {
        cJSON *schema = cJSON_Parse(text);
        if (schema == NULL) {
            fprintf(stderr, "tandem-client: %s: %s is not JSON\n", flag, path);
            free(text);
            cJSON_Delete(g);
            return -1;
        }
        ok = cJSON_AddItemToObject(g, "schema", schema);
    }
    free(text);
    if (!ok) {
        fprintf(stderr, "tandem-client: out of memory\n");
        cJSON_Delete(g);
        return -1;
    }
    *grammar = g;
    return 0;
}

static void usage(FILE *out)
{
    fprintf(out,
            "usage: tandem-client [--endpoint E] (--prompt TEXT | --chat TEXT | --ids 1,2,3)\n"
            "                     [--max-tokens N] [--temperature T] [--top-k K] [--top-p P] [--min-p P]\n"
            "                     [--seed S] [--stop STR]... [--spec-k K] [--spec-mode sampled|point_mass]\n"
            "                     [--draft-source auto|model|ngram|suffix|none] (--draft: the old spelling)\n"
            "                     [--logprobs N (0..20 top alternatives; printed with --json)]\n"
            "                     [--presence-penalty X] [--frequency-penalty X] [--repetition-penalty X]\n"
            "                     [--grammar-file FILE (GBNF) | --json-schema FILE | --json-object]\n"
            "                     [--n N (choices, 1..16; not with --stream)]\n"
            "                     [--stream] [--json] [--timeout-ms N] [--cancel-after-ms N]\n"
            "       tandem-client [--endpoint E] --stats [--prometheus] [--timeout-ms N]\n"
            "CURVE (a coordinator with curve_secret_key_file): --curve-server-key FILE (its public\n"
            "key) [--curve-key FILE (this client's secret key; default: a fresh pair)]\n"
            "default endpoint: %s, default timeout: 600000 ms\n",
            TANDEM_CLIENT_DEFAULT_ENDPOINT);
}

static int parse_long(const char *flag, const char *s, long lo, long hi, long *out)
{
    char *end = NULL;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0' || v < lo || v > hi) {
        fprintf(stderr, "tandem-client: %s: expected an integer in %ld..%ld, got \"%s\"\n", flag, lo, hi, s);
        return -1;
    }
    *out = v;
    return 0;
}

static int parse_double(const char *flag, const char *s, double *out)
{
    char *end = NULL;
    errno = 0;
    double v = strtod(s, &end);
    if (errno != 0 || end == s || *end != '\0') {
        fprintf(stderr, "tandem-client: %s: expected a number, got \"%s\"\n", flag, s);
        return -1;
    }
    *out = v;
    return 0;
}

/* "1,2,3" -> malloc'd ids. */
static int parse_ids(const char *s, int32_t **out, int *n_out)
{
    int cap = 16, n = 0;
    int32_t *ids = malloc(sizeof(*ids) * (size_t)cap);
    if (ids == NULL)
        return -1;
    const char *p = s;
    while (*p != '\0') {
        char *end = NULL;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (errno != 0 || end == p || v < 0 || v > INT32_MAX || (*end != ',' && *end != '\0') ||
            n >= CLIENT_IDS_MAX) {
            fprintf(stderr, "tandem-client: --ids: expected comma-separated non-negative integers, got \"%s\"\n", s);
            free(ids);
            return -1;
        }
        if (n == cap) {
            cap *= 2;
            int32_t *grown = realloc(ids, sizeof(*ids) * (size_t)cap);
            if (grown == NULL) {
                free(ids);
                return -1;
            }
            ids = grown;
        }
        ids[n++] = (int32_t)v;
        p = *end == ',' ? end + 1 : end;
    }
    if (n == 0) {
        fprintf(stderr, "tandem-client: --ids: no ids given\n");
        free(ids);
        return -1;
    }
    *out = ids;
    *n_out = n;
    return 0;
}

static double num_at(const cJSON *obj, const char *section, const char *name)
{
    const cJSON *s = section ? cJSON_GetObjectItemCaseSensitive(obj, section) : obj;
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(s, name);
    return cJSON_IsNumber(v) ? v->valuedouble : 0.0;
}

/* The --json summary of a done reply. */
static int print_json_summary(const cJSON *done)
{
    cJSON *o = cJSON_CreateObject();
    if (o == NULL)
        return -1;
    const cJSON *ids = cJSON_GetObjectItemCaseSensitive(done, "ids");
    const cJSON *text = cJSON_GetObjectItemCaseSensitive(done, "text");
    const cJSON *finish = cJSON_GetObjectItemCaseSensitive(done, "finish_reason");
    int ok = cJSON_AddItemToObject(o, "ids", ids ? cJSON_Duplicate(ids, 1) : cJSON_CreateArray());
    ok = ok && cJSON_AddStringToObject(o, "text", cJSON_IsString(text) ? text->valuestring : "") != NULL;
    ok = ok && cJSON_AddNumberToObject(o, "prompt_tokens", num_at(done, "usage", "prompt_tokens")) != NULL;
    ok = ok && cJSON_AddNumberToObject(o, "generated_tokens", num_at(done, "usage", "generated_tokens")) != NULL;
    ok = ok && cJSON_AddNumberToObject(o, "prefill_ms", num_at(done, "timing", "prefill_ms")) != NULL;
    ok = ok && cJSON_AddNumberToObject(o, "decode_ms", num_at(done, "timing", "decode_ms")) != NULL;
    ok = ok && cJSON_AddNumberToObject(o, "tokens_per_s", num_at(done, "timing", "tokens_per_s")) != NULL;
    ok = ok && cJSON_AddNumberToObject(o, "acceptance_rate", num_at(done, "spec", "acceptance_rate")) != NULL;
    ok = ok && cJSON_AddNumberToObject(o, "rounds", num_at(done, "spec", "rounds")) != NULL;
    ok = ok && cJSON_AddNumberToObject(o, "mean_accepted_per_round",
                                       num_at(done, "spec", "mean_accepted_per_round")) != NULL;
    ok = ok && cJSON_AddNumberToObject(o, "draft_ms", num_at(done, "spec", "draft_ms")) != NULL;
    ok = ok && cJSON_AddNumberToObject(o, "verify_ms", num_at(done, "spec", "verify_ms")) != NULL;
    ok = ok && cJSON_AddStringToObject(o, "finish_reason", cJSON_IsString(finish) ? finish->valuestring : "") != NULL;
    ok = ok && cJSON_AddNumberToObject(o, "queue_ms", num_at(done, "timing", "queue_ms")) != NULL;
    ok = ok && cJSON_AddNumberToObject(o, "total_ms", num_at(done, "timing", "total_ms")) != NULL;
    ok = ok && cJSON_AddNumberToObject(o, "drafted", num_at(done, "spec", "drafted")) != NULL;
    ok = ok && cJSON_AddNumberToObject(o, "accepted", num_at(done, "spec", "accepted")) != NULL;
    ok = ok && cJSON_AddNumberToObject(o, "predraft_offered", num_at(done, "spec", "predraft_offered")) != NULL;
    ok = ok && cJSON_AddNumberToObject(o, "predraft_used", num_at(done, "spec", "predraft_used")) != NULL;
    const cJSON *index = cJSON_GetObjectItemCaseSensitive(done, "index");
    if (cJSON_IsNumber(index)) /* one of several choices */
        ok = ok && cJSON_AddNumberToObject(o, "index", index->valuedouble) != NULL;
    const cJSON *lp = cJSON_GetObjectItemCaseSensitive(done, "logprobs");
    if (lp != NULL) /* with --logprobs: the done reply's entries as they are */
        ok = ok && cJSON_AddItemToObject(o, "logprobs", cJSON_Duplicate(lp, 1));
    char *s = ok ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    if (s == NULL)
        return -1;
    printf("%s\n", s);
    cJSON_free(s);
    return 0;
}

static int run_stats(struct tandem_client *client, const char *endpoint, int timeout_ms, int prometheus)
{
    char err[ERR_MSG_MAX];
    cJSON *stats = NULL;
    const double t_start = monotonic_ms();
    int first_ms = timeout_ms < CLIENT_CONNECT_WAIT_MS ? timeout_ms : CLIENT_CONNECT_WAIT_MS;
    int rc = tandem_client_stats(client, first_ms, &stats, err);
    if (rc == ERR_TIMEOUT && first_ms < timeout_ms) {
        int status = check_connected(client, endpoint, t_start - CLIENT_CONNECT_WAIT_MS);
        if (status != 0)
            return status;
        /* connected, slow to answer: the rest of the timeout */
        struct tandem_client_event ev;
        for (;;) {
            rc = tandem_client_recv(client, timeout_ms - first_ms, &ev, err);
            if (rc != 0 || ev.type == TANDEM_CLIENT_EVENT_STATS)
                break;
            tandem_client_event_free(&ev);
        }
        if (rc == 0)
            stats = ev.json;
    }
    if (rc != 0) {
        fprintf(stderr, "tandem-client: %s\n", err);
        return 3;
    }
    if (prometheus) {
        const cJSON *p = cJSON_GetObjectItemCaseSensitive(stats, "prometheus");
        fputs(cJSON_IsString(p) ? p->valuestring : "", stdout);
    } else {
        cJSON_DeleteItemFromObjectCaseSensitive(stats, "prometheus");
        char *s = cJSON_Print(stats);
        if (s != NULL) {
            printf("%s\n", s);
            cJSON_free(s);
        }
    }
    cJSON_Delete(stats);
    return 0;
}

/* The final replies of a request of n > 1 choices, kept until all came
 * (done: the reply; a failed choice: NULL, counted in failed). */
struct choices {
    int n, ended, failed;
    cJSON *done[16];
    bool seen[16];
};

/* Prints the choices in index order; the exit status. */
static int choices_print(struct choices *ch, int json)
{
    int status = ch->failed > 0 ? 1 : 0;
    for (int i = 0; i < ch->n; i++) {
        if (ch->done[i] == NULL)
            continue;
        if (json) {
            if (print_json_summary(ch->done[i]) != 0)
                status = 3;
        } else {
            const cJSON *text = cJSON_GetObjectItemCaseSensitive(ch->done[i], "text");
            printf("[choice %d]\n%s\n", i, cJSON_IsString(text) ? text->valuestring : "");
        }
    }
    return status;
}

/* A final reply of one choice (its "index"); takes ev's JSON for a done.
 * Returns the exit status once every choice has ended, else -1. */
static int choices_end(struct choices *ch, struct tandem_client_event *ev, int json)
{
    const cJSON *index = cJSON_GetObjectItemCaseSensitive(ev->json, "index");
    const int i = cJSON_IsNumber(index) ? (int)index->valuedouble : -1;
    if (i < 0 || i >= ch->n || ch->seen[i]) {
        fprintf(stderr, "tandem-client: a reply names choice %d of %d twice or out of range\n", i, ch->n);
        return 3;
    }
    ch->seen[i] = true;
    if (ev->type == TANDEM_CLIENT_EVENT_DONE) {
        ch->done[i] = ev->json;
        ev->json = NULL;
    } else {
        fprintf(stderr, "tandem-client: choice %d: error %s: %s\n", i, ev->code, ev->message);
        ch->failed++;
    }
    return ++ch->ended == ch->n ? choices_print(ch, json) : -1;
}

/* A generate request sent, its replies awaited. */
struct generate_run {
    struct tandem_client *client;
    const char *endpoint;
    const struct tandem_client_request *req;
    int timeout_ms, json;
    long cancel_after_ms;
    double t_sent;
};

/* Where a request's cancel stands: sent (by --cancel-after-ms or a
 * signal), and when the signal's went. */
struct cancel_state {
    bool sent;
    double interrupted_ms; /* < 0: no signal yet */
};

/* Sends the cancel a signal or --cancel-after-ms calls for. Returns an exit
 * status when the client must stop now (a second signal, nobody to cancel
 * with, no answer in time, a failed send), else -1. */
static int cancel_step(const struct generate_run *g, struct cancel_state *cs)
{
    char err[ERR_MSG_MAX];
    if (g_interrupted && cs->interrupted_ms < 0) {
        bool connected = false;
        /* nobody to cancel with, or a second signal: exit now */
        if (tandem_client_has_connected(g->client, &connected, err) != 0 || !connected || g_interrupted > 1) {
            fprintf(stderr, "tandem-client: interrupted\n");
            return CLIENT_EXIT_INTERRUPTED;
        }
        if (!cs->sent && tandem_client_cancel(g->client, g->req->id, err) != 0) {
            fprintf(stderr, "tandem-client: %s\n", err);
            return 3;
        }
        cs->sent = true;
        cs->interrupted_ms = monotonic_ms();
    }
    if (cs->interrupted_ms >= 0 &&
        (g_interrupted > 1 || monotonic_ms() - cs->interrupted_ms >= CLIENT_CANCEL_WAIT_MS)) {
        fprintf(stderr, "tandem-client: interrupted (cancel sent, no answer within %d ms)\n", CLIENT_CANCEL_WAIT_MS);
        return CLIENT_EXIT_INTERRUPTED;
    }
    if (!cs->sent && g->cancel_after_ms >= 0 && monotonic_ms() - g->t_sent >= (double)g->cancel_after_ms) {
        if (tandem_client_cancel(g->client, g->req->id, err) != 0) {
            fprintf(stderr, "tandem-client: %s\n", err);
            return 3;
        }
        cs->sent = true;
    }
    return -1;
}

static int generate_loop(const struct generate_run *g, struct choices *ch)
{
    struct tandem_client *client = g->client;
    const struct tandem_client_request *req = g->req;
    const int timeout_ms = g->timeout_ms, json = g->json;
    const double t_sent = g->t_sent;
    char err[ERR_MSG_MAX];
    int rc = 0;
    long since_event_ms = 0;
    struct cancel_state cs = {.sent = false, .interrupted_ms = -1};
    for (;;) {
        const int stop = cancel_step(g, &cs);
        if (stop >= 0)
            return stop;
        int unreached = check_connected(client, g->endpoint, t_sent);
        if (unreached != 0)
            return unreached;
        struct tandem_client_event ev;
        rc = tandem_client_recv(client, CLIENT_POLL_SLICE_MS, &ev, err);
        if (rc == ERR_TIMEOUT || rc == ERR_CANCELLED) {
            since_event_ms += CLIENT_POLL_SLICE_MS;
            if (since_event_ms < timeout_ms)
                continue;
            snprintf(err, sizeof(err), "no reply from the coordinator within %d ms", timeout_ms);
        }
        since_event_ms = 0;
        if (rc != 0) {
            fprintf(stderr, "tandem-client: %s\n", err);
            return 3;
        }
        if (strcmp(ev.id, req->id) != 0 && ev.type != TANDEM_CLIENT_EVENT_ERROR) {
            tandem_client_event_free(&ev);
            continue;
        }
        int status = -1;
        switch (ev.type) {
        case TANDEM_CLIENT_EVENT_TOKEN:
            if (!json) {
                fputs(ev.text, stdout);
                fflush(stdout);
            }
            break;
        case TANDEM_CLIENT_EVENT_DONE:
            if (ch->n > 1)
                status = choices_end(ch, &ev, json);
            else if (json)
                status = print_json_summary(ev.json) == 0 ? 0 : 3;
            else {
                if (!req->stream)
                    fputs(ev.text, stdout);
                fputc('\n', stdout);
                status = 0;
            }
            break;
        case TANDEM_CLIENT_EVENT_ERROR:
            if (cs.interrupted_ms >= 0 && strcmp(ev.code, "cancelled") == 0) {
                fprintf(stderr, "tandem-client: interrupted; the request was cancelled\n");
                status = CLIENT_EXIT_INTERRUPTED;
                break;
            }
            if (ch->n > 1 && cJSON_GetObjectItemCaseSensitive(ev.json, "index") != NULL) {
                status = choices_end(ch, &ev, json);
                break;
            }
            fprintf(stderr, "tandem-client: error %s: %s\n", ev.code, ev.message);
            if (json) {
                char *s = cJSON_PrintUnformatted(ev.json);
                if (s != NULL) {
                    printf("%s\n", s);
                    cJSON_free(s);
                }
            }
            status = 1;
            break;
        default:
            break;
        }
        tandem_client_event_free(&ev);
        if (status >= 0)
            return status;
    }
}

static int run_generate(struct tandem_client *client, const char *endpoint, const struct tandem_client_request *req,
                        int timeout_ms, int json, long cancel_after_ms)
{
    char err[ERR_MSG_MAX];
    int rc = tandem_client_generate(client, req, err);
    if (rc != 0) {
        fprintf(stderr, "tandem-client: %s\n", err);
        return 3;
    }
    /* The cancel is timed on the clock: a stream whose tokens keep coming
     * never lets a receive time out, so counting timed-out slices would
     * never reach it. */
    const double t_sent = monotonic_ms();
    struct choices ch = {.n = req->n > 1 ? req->n : 1};
    const struct generate_run g = {.client = client, .endpoint = endpoint, .req = req, .timeout_ms = timeout_ms,
                                   .json = json, .cancel_after_ms = cancel_after_ms, .t_sent = t_sent};
    int status = generate_loop(&g, &ch);
    for (int i = 0; i < ch.n; i++)
        cJSON_Delete(ch.done[i]);
    return status;
}


/* Connects to endpoint, over CURVE when server_key_file is given (with the
 * client's own key from client_key_file, or an ephemeral one). 0, or -1
 * after saying why on stderr. */
static int open_client(const char *endpoint, const char *server_key_file, const char *client_key_file,
                       struct tandem_client **out)
{
    char err[ERR_MSG_MAX];
    int crc = 0;
    if (server_key_file != NULL) {
        char server_pub[CURVE_KEY_Z85_SIZE], client_sec[CURVE_KEY_Z85_SIZE], why[ERR_MSG_MAX];
        if ((crc = curve_key_load(server_key_file, false, server_pub, why)) != 0)
            snprintf(err, sizeof err, "--curve-server-key: %.480s", why);
        else if (client_key_file && (crc = curve_key_load(client_key_file, true, client_sec, why)) != 0)
            snprintf(err, sizeof err, "--curve-key: %.480s", why);
        else
            crc = tandem_client_create_curve(out, endpoint, server_pub, client_key_file ? client_sec : NULL, err);
        memset(client_sec, 0, sizeof client_sec);
    } else if (client_key_file != NULL) {
        crc = error_set(err, ERR_INVALID_ARG, "--curve-key: needs --curve-server-key");
    } else {
        crc = tandem_client_create(out, endpoint, err);
    }
    if (crc != 0) {
        fprintf(stderr, "tandem-client: %s\n", err);
        return -1;
    }
    return 0;
}

/* The command line, parsed. */
struct cli {
    const char *endpoint, *server_key_file, *client_key_file;
    struct tandem_client_request req;
    int32_t *ids; /* --ids (owned) */
    cJSON *grammar; /* --grammar-file, --json-schema, --json-object (owned) */
    int stats, prometheus, json;
    long timeout_ms, cancel_after_ms;
};

/* An integer option in lo..hi: 1 taken, -1 said why not. */
static int int_option(const char *a, const char *v, long lo, long hi, int *out)
{
    long l = 0;
    if (parse_long(a, v, lo, hi, &l) != 0)
        return -1;
    *out = (int)l;
    return 1;
}

/* An option of the request a with its value v: 1 taken, 0 not one of
 * them, -1 a bad value (said on stderr). Ranges the coordinator checks
 * (penalties, the draft source, the mode) are its to name. */
static int request_option(struct cli *cli, const char *a, const char *v)
{
    struct tandem_client_request *req = &cli->req;
    double d = 0;
    if (strcmp(a, "--prompt") == 0) {
        req->prompt = v;
    } else if (strcmp(a, "--chat") == 0) {
        req->chat = v;
    } else if (strcmp(a, "--ids") == 0) {
        free(cli->ids);
        cli->ids = NULL;
        if (parse_ids(v, &cli->ids, &req->n_ids) != 0)
            return -1;
        req->ids = cli->ids;
    } else if (strcmp(a, "--max-tokens") == 0) {
        return int_option(a, v, 1, INT32_MAX, &req->max_tokens);
    } else if (strcmp(a, "--top-k") == 0) {
        return int_option(a, v, 0, INT32_MAX, &req->top_k);
    } else if (strcmp(a, "--temperature") == 0 || strcmp(a, "--top-p") == 0 || strcmp(a, "--min-p") == 0 ||
               strcmp(a, "--presence-penalty") == 0 || strcmp(a, "--frequency-penalty") == 0 ||
               strcmp(a, "--repetition-penalty") == 0) {
        if (parse_double(a, v, &d) != 0)
            return -1;
        *(strcmp(a, "--temperature") == 0        ? &req->temperature
          : strcmp(a, "--top-p") == 0            ? &req->top_p
          : strcmp(a, "--min-p") == 0            ? &req->min_p
          : strcmp(a, "--presence-penalty") == 0 ? &req->presence_penalty
          : strcmp(a, "--frequency-penalty") == 0 ? &req->frequency_penalty
                                                  : &req->repetition_penalty) = d;
    } else if (strcmp(a, "--seed") == 0) {
        char *end = NULL;
        errno = 0;
        unsigned long long s = strtoull(v, &end, 10);
        if (errno != 0 || end == v || *end != '\0' || v[0] == '-') {
            fprintf(stderr, "tandem-client: --seed: expected a non-negative integer, got \"%s\"\n", v);
            return -1;
        }
        req->seed = s;
        req->has_seed = true;
    } else if (strcmp(a, "--stop") == 0) {
        if (req->n_stop >= TANDEM_CLIENT_STOP_MAX) {
            fprintf(stderr, "tandem-client: --stop: at most %d stop strings\n", TANDEM_CLIENT_STOP_MAX);
            return -1;
        }
        req->stop[req->n_stop++] = v;
    } else if (strcmp(a, "--spec-k") == 0) {
        return int_option(a, v, 0, 16, &req->spec_k);
    } else if (strcmp(a, "--logprobs") == 0) {
        return int_option(a, v, 0, 20, &req->logprobs);
    } else if (strcmp(a, "--n") == 0) {
        return int_option(a, v, 1, 16, &req->n);
    } else if (strcmp(a, "--spec-mode") == 0) {
        req->spec_mode = v;
    } else if (strcmp(a, "--draft-source") == 0 || strcmp(a, "--draft") == 0) {
        /* --draft names a model directory in the supervisor and
         * tandem-generate; the old spelling is still accepted here */
        req->draft = v;
    } else if (strcmp(a, "--id") == 0) {
        req->id = v;
    } else {
        return 0;
    }
    return 1;
}

/* 0 with cli filled, 1 after --help (printed), -1 after saying what was
 * wrong (exit status 2). */
static int parse_args(int argc, char **argv, struct cli *cli)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        long l = 0;
        int takes_value = 1;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            return 1;
        } else if (strcmp(a, "--stats") == 0 || strcmp(a, "--prometheus") == 0 || strcmp(a, "--json") == 0) {
            *(a[2] == 's' ? &cli->stats : a[2] == 'p' ? &cli->prometheus : &cli->json) = 1, takes_value = 0;
        } else if (strcmp(a, "--stream") == 0) {
            cli->req.stream = true, takes_value = 0;
        } else if (strcmp(a, "--json-object") == 0) {
            takes_value = 0;
            if (set_grammar(&cli->grammar, "json_object", NULL, NULL) != 0)
                return -1;
        } else if (strcmp(a, "--grammar-file") == 0 || strcmp(a, "--json-schema") == 0) {
            if (v == NULL || set_grammar(&cli->grammar, a[2] == 'g' ? "gbnf" : "json_schema", a, v) != 0) {
                if (v == NULL)
                    fprintf(stderr, "tandem-client: %s: missing value\n", a);
                return -1;
            }
        } else if (v == NULL) {
            fprintf(stderr, "tandem-client: %s: unknown option or missing value\n", a);
            usage(stderr);
            return -1;
        } else if (strcmp(a, "--endpoint") == 0) {
            cli->endpoint = v;
        } else if (strcmp(a, "--curve-server-key") == 0) {
            cli->server_key_file = v;
        } else if (strcmp(a, "--curve-key") == 0) {
            cli->client_key_file = v;
        } else if (strcmp(a, "--timeout-ms") == 0 || strcmp(a, "--cancel-after-ms") == 0) {
            const int timeout = a[2] == 't';
            if (parse_long(a, v, timeout ? 1 : 0, INT32_MAX, &l) != 0)
                return -1;
            *(timeout ? &cli->timeout_ms : &cli->cancel_after_ms) = l;
        } else {
            const int r = request_option(cli, a, v);
            if (r < 0)
                return -1;
            if (r == 0) {
                fprintf(stderr, "tandem-client: %s: unknown option\n", a);
                usage(stderr);
                return -1;
            }
        }
        if (takes_value)
            i++;
    }
    cli->req.grammar = cli->grammar;
    const struct tandem_client_request *req = &cli->req;
    if (req->n > 1 && req->stream) {
        fprintf(stderr, "tandem-client: --stream takes one choice (--n 1): the choices' tokens would interleave\n");
        return -1;
    }
    if (!cli->stats && (req->prompt != NULL) + (req->chat != NULL) + (req->ids != NULL) != 1) {
        fprintf(stderr, "tandem-client: give exactly one of --prompt, --chat, --ids (or --stats)\n");
        usage(stderr);
        return -1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    struct cli cli = {.endpoint = TANDEM_CLIENT_DEFAULT_ENDPOINT, .timeout_ms = 600000, .cancel_after_ms = -1};
    tandem_client_request_init(&cli.req);
    cli.req.id = "cli";
    int status = 2;
    const int parsed = parse_args(argc, argv, &cli);
    if (parsed != 0) {
        free(cli.ids);
        cJSON_Delete(cli.grammar);
        return parsed > 0 ? 0 : 2;
    }
    struct tandem_client *client = NULL;
    if (open_client(cli.endpoint, cli.server_key_file, cli.client_key_file, &client) != 0)
        goto done;
    if (cli.stats) {
        status = run_stats(client, cli.endpoint, (int)cli.timeout_ms, cli.prometheus);
    } else {
        struct sigaction sa = {.sa_handler = on_signal};
        sigemptyset(&sa.sa_mask);
        if (sigaction(SIGINT, &sa, NULL) != 0 || sigaction(SIGTERM, &sa, NULL) != 0)
            perror("tandem-client: sigaction"); /* a signal then ends it without a cancel */
        status = run_generate(client, cli.endpoint, &cli.req, (int)cli.timeout_ms, cli.json, cli.cancel_after_ms);
    }
    tandem_client_destroy(client);
done:
    free(cli.ids);
    cJSON_Delete(cli.grammar);
    return status;
}
