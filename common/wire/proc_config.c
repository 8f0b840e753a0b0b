/* proc_config.c: loading, overriding and validating the process config.
 *
 * Keys are described by one table per section kind (coordinator, worker);
 * the JSON loader and the command-line setter both go through that table, so
 * a key has one type, one range and one validator whichever way it arrives.
 * Per-key checks (types, ranges, enums, endpoint syntax) run when a value is
 * set; cross-key checks and derived defaults run in proc_config_finalize.
 */
#include "proc_config.h"

#include "json_type.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "curve_keys.h"
#include "error.h"
#include "logging.h"
#include "request.h"

#define PROC_CONFIG_FILE_MAX_BYTES (1 << 20)
#define PROC_CONFIG_INSTANCE_MAX 40

enum key_kind {
    KEY_STRING,
    KEY_INT,
    KEY_DEVICE, /* JSON integer >= 0 or string */
};

typedef int (*key_check_fn)(const char *value, char *msg, size_t msg_size);

struct key_desc {
    const char *name;
    enum key_kind kind;
    size_t offset;  /* within the section struct */
    size_t size;    /* KEY_STRING / KEY_DEVICE: buffer size */
    int min, max;   /* KEY_INT */
    key_check_fn check;
    const char *help;
};

static int check_endpoint(const char *value, char *msg, size_t msg_size)
{
    char err[ERR_MSG_MAX];
    if (proc_config_check_endpoint(value, err) != 0) {
        snprintf(msg, msg_size, "%s", err);
        return -1;
    }
    return 0;
}

static int check_endpoint_or_empty(const char *value, char *msg, size_t msg_size)
{
    return value[0] == '\0' ? 0 : check_endpoint(value, msg, msg_size);
}

static int check_backend(const char *value, char *msg, size_t msg_size)
{
    if (strcmp(value, "cpu") == 0 || strcmp(value, "cuda") == 0)
        return 0;
    snprintf(msg, msg_size, "must be \"cpu\" or \"cuda\", got \"%s\"", value);
    return -1;
}

static int check_shm_transport(const char *value, char *msg, size_t msg_size)
{
    if (strcmp(value, "auto") == 0 || strcmp(value, "posix") == 0 ||
        strcmp(value, "cuda_ipc") == 0)
        return 0;
    snprintf(msg, msg_size, "must be \"auto\", \"posix\" or \"cuda_ipc\", got \"%s\"", value);
    return -1;
}

static int check_sampler(const char *value, char *msg, size_t msg_size)
{
    if (strcmp(value, "auto") == 0 || strcmp(value, "device") == 0 ||
        strcmp(value, "host") == 0)
        return 0;
    snprintf(msg, msg_size, "must be \"auto\", \"device\" or \"host\", got \"%s\"", value);
    return -1;
}

static int check_quantize(const char *value, char *msg, size_t msg_size)
{
    if (strcmp(value, "none") == 0 || strcmp(value, "int8") == 0 || strcmp(value, "int4") == 0)
        return 0;
    snprintf(msg, msg_size, "must be \"none\", \"int8\" or \"int4\", got \"%s\"", value);
    return -1;
}

static int check_spec_mode(const char *value, char *msg, size_t msg_size)
{
    if (strcmp(value, "sampled") == 0 || strcmp(value, "point_mass") == 0)
        return 0;
    snprintf(msg, msg_size, "must be \"sampled\" or \"point_mass\", got \"%s\"", value);
    return -1;
}

static int check_draft(const char *value, char *msg, size_t msg_size)
{
    enum request_draft d;
    if (request_draft_parse(value, "coordinator.draft", &d, NULL) == 0)
        return 0;
    snprintf(msg, msg_size, "must be \"auto\", \"model\", \"ngram\", \"suffix\" or \"none\", got \"%s\"", value);
    return -1;
}

static int check_spec_tree(const char *value, char *msg, size_t msg_size)
{
    int t;
    if (request_spec_tree_parse_text(value, "coordinator.spec_tree", &t, NULL) == 0)
        return 0;
    snprintf(msg, msg_size, "must be \"off\", \"auto\" or a node budget %d..%d, got \"%s\"",
             REQUEST_SPEC_TREE_MIN, REQUEST_SPEC_TREE_MAX, value);
    return -1;
}

static int check_log_level(const char *value, char *msg, size_t msg_size)
{
    if (logging_level_parse(value) >= 0)
        return 0;
    snprintf(msg, msg_size, "must be \"error\", \"warn\", \"info\" or \"debug\", got \"%s\"",
             value);
    return -1;
}

static int check_nonempty(const char *value, char *msg, size_t msg_size)
{
    if (value[0] != '\0')
        return 0;
    snprintf(msg, msg_size, "must not be empty");
    return -1;
}

static int check_device(const char *value, char *msg, size_t msg_size)
{
    for (const char *p = value; *p; p++) {
        if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
              *p == '-' || *p == ':' || *p == '.' || *p == '_')) {
            snprintf(msg, msg_size,
                     "must be a device index or a UUID / PCI bus id, got \"%s\"", value);
            return -1;
        }
    }
    return 0;
}

static int check_listen(const char *value, char *msg, size_t msg_size)
{
    char err[ERR_MSG_MAX];
    if (proc_config_check_listen(value, err) != 0) {
        snprintf(msg, msg_size, "%s", err);
        return -1;
    }
    return 0;
}

static int check_listen_or_empty(const char *value, char *msg, size_t msg_size)
{
    return value[0] == '\0' ? 0 : check_listen(value, msg, msg_size);
}

static int check_env_name(const char *value, char *msg, size_t msg_size)
{
    for (const char *p = value; *p; p++) {
        if (!((*p >= '0' && *p <= '9' && p != value) || (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
              *p == '_')) {
            snprintf(msg, msg_size, "must be an environment variable name ([A-Za-z_][A-Za-z0-9_]*), got \"%s\"",
                     value);
            return -1;
        }
    }
    return 0;
}

#define CKEY_STR(field, chk, h) \
    {#field, KEY_STRING, offsetof(struct coordinator_config, field), \
     sizeof(((struct coordinator_config *)0)->field), 0, 0, chk, h}
#define CKEY_INT(field, lo, hi, h) \
    {#field, KEY_INT, offsetof(struct coordinator_config, field), 0, lo, hi, NULL, h}
#define WKEY_STR(field, chk, h) \
    {#field, KEY_STRING, offsetof(struct worker_config, field), \
     sizeof(((struct worker_config *)0)->field), 0, 0, chk, h}
#define WKEY_INT(field, lo, hi, h) \
    {#field, KEY_INT, offsetof(struct worker_config, field), 0, lo, hi, NULL, h}

#define GKEY_STR(field, chk, h) \
    {#field, KEY_STRING, offsetof(struct gateway_config, field), \
     sizeof(((struct gateway_config *)0)->field), 0, 0, chk, h}
#define GKEY_INT(field, lo, hi, h) \
    {#field, KEY_INT, offsetof(struct gateway_config, field), 0, lo, hi, NULL, h}

static const struct key_desc gateway_keys[] = {
    GKEY_STR(listen, check_listen, "HTTP listen address host:port [127.0.0.1:8000]"),
    GKEY_STR(coordinator_endpoint, check_endpoint_or_empty, "coordinator client endpoint [coordinator.client_endpoint]"),
    GKEY_STR(served_model_name, NULL,
             "model name clients send (or leave out) [target_worker.model's basename; ORG/NAME for a "
             "HuggingFace cache snapshot]"),
    GKEY_STR(api_key, NULL, "required Bearer key, \"\" = none [\"\"]"),
    GKEY_STR(api_key_env, check_env_name, "environment variable holding the key [\"\"]"),
    GKEY_STR(coordinator_curve_public_key_file, NULL,
             "the coordinator's CURVE public key, when its client endpoint uses CURVE [none]"),
    GKEY_STR(curve_secret_key_file, NULL,
             "the gateway's CURVE secret key, for a coordinator that lists client keys [a fresh pair]"),
    GKEY_STR(tls_cert_file, NULL, "PEM certificate (chain): serve HTTPS [\"\": plain HTTP]"),
    GKEY_STR(tls_key_file, NULL, "the certificate's PEM private key, unencrypted [\"\"]"),
    GKEY_STR(tls_client_ca_file, NULL,
             "PEM CA(s): a client must present a certificate they signed (with tls_cert_file) [\"\"]"),
    GKEY_INT(max_body_bytes, 0, 1 << 30,
             "largest request body, at most coordinator.max_message_bytes less 512; 0 = that "
             "[coordinator.max_message_bytes - 512]"),
    GKEY_INT(max_connections, 1, 65536, "concurrent HTTP connections [1024]"),
    GKEY_INT(max_connections_per_ip, 0, 65536,
             "concurrent connections from one client address, 0 = no limit (behind a proxy on "
             "this host) [64]"),
    GKEY_INT(header_timeout_ms, 100, 3600000,
             "time to send a request's line and headers, from the connection's start or its "
             "previous response; then the connection is closed [5000]"),
    GKEY_INT(body_timeout_ms, 100, 3600000,
             "time to send a request's body once its headers are in; then the connection is "
             "closed [10000]"),
    GKEY_INT(threads, 0, 256, "HTTP event-loop threads, 0 = one per core, at most 16 [0]"),
    GKEY_INT(request_timeout_ms, 1, INT_MAX, "coordinator silence before a 504 [600000]"),
    GKEY_INT(allow_unauthenticated, 0, 1,
             "1: listen on an address other machines reach without an API key [0]"),
    GKEY_INT(metrics_require_key, 0, 1, "1: GET /metrics needs the API key too [0]"),
    GKEY_INT(strict_fields, 0, 1,
             "1: a request field the gateway does not know is a 400; 0: accepted, named in the "
             "Tandem-Ignored-Fields header and the log [0]"),
    GKEY_STR(log_level, check_log_level, "error|warn|info|debug [info]"),
};

static const struct key_desc coordinator_keys[] = {
    CKEY_STR(client_endpoint, check_endpoint, "client ROUTER endpoint [tcp://127.0.0.1:5555]"),
    CKEY_STR(worker_endpoint, check_endpoint_or_empty,
             "worker ROUTER endpoint [ipc://<run_dir>/workers.sock]"),
    CKEY_STR(tokenizer, NULL, "model dir holding tokenizer.json [target_worker.model]"),
    CKEY_INT(max_concurrency, 1, 4096, "sequences in flight [8]"),
    CKEY_INT(max_queue, 0, 1000000, "queued requests beyond max_concurrency [64]"),
    CKEY_INT(heartbeat_ms, 10, 600000, "heartbeat interval [500]"),
    CKEY_INT(worker_timeout_ms, 20, 3600000, "worker silence before it is dead [3000]"),
    CKEY_INT(request_timeout_ms, 1, INT_MAX, "request deadline [600000]"),
    CKEY_INT(max_message_bytes, 1024, 1 << 30, "largest accepted message [1048576]"),
    CKEY_INT(spec_k, 0, PROC_CONFIG_SPEC_K_LIMIT, "draft tokens per round, 0 = adaptive [0]"),
    CKEY_INT(spec_k_max, 1, PROC_CONFIG_SPEC_K_LIMIT, "adaptive K upper bound [8]"),
    CKEY_STR(spec_mode, check_spec_mode, "\"sampled\" or \"point_mass\" [sampled]"),
    CKEY_STR(draft, check_draft, "drafts of requests that name none: auto|model|ngram|suffix|none [auto]"),
    CKEY_STR(spec_tree, check_spec_tree,
             "model-free drafts as token trees: off|auto|a node budget 2..32 (docs/token-trees.md) [auto]"),
    CKEY_INT(suffix_cache_mib, 0, 65536, "the suffix cache's budget in MiB (earlier requests' tokens), 0 = off [64]"),
    CKEY_STR(log_level, check_log_level, "error|warn|info|debug [info]"),
    CKEY_STR(metrics_listen, check_listen_or_empty,
             "host:port serving the Prometheus text at GET /metrics, without a gateway [none]"),
    CKEY_STR(curve_secret_key_file, NULL, "CURVE secret key of the client endpoint [none]"),
    CKEY_STR(curve_client_keys_file, NULL, "public keys of the clients admitted [any]"),
    CKEY_INT(insecure, 0, 1, "1: non-loopback client endpoint without CURVE [0]"),
    CKEY_INT(external_workers, 0, 1, "1: worker endpoint may be non-local [0]"),
    CKEY_STR(worker_curve_secret_key_file, NULL, "CURVE secret key of the worker endpoint [none]"),
    CKEY_STR(worker_curve_keys_file, NULL, "public keys of the workers admitted [none]"),
    CKEY_INT(max_requests_per_client, 0, 1000000, "requests in flight per client, 0 = no limit [0]"),
    CKEY_INT(worker_lane, 0, 1, "1: an ipc:// worker's messages on a direct socket [1]"),
};

static const struct key_desc worker_keys[] = {
    WKEY_STR(model, check_nonempty, "HF model directory (required)"),
    WKEY_STR(backend, check_backend, "\"cpu\" or \"cuda\" [cpu]"),
    {"device", KEY_DEVICE, offsetof(struct worker_config, device),
     sizeof(((struct worker_config *)0)->device), 0, 0, check_device,
     "cuda device: index or UUID [0]"},
    WKEY_INT(threads, 0, 4096, "cpu threads, 0 = one per core [0]"),
    WKEY_INT(max_seq_len, 0, 1 << 20, "positions per slot, 0 = model limit [8192]"),
    WKEY_STR(coordinator_endpoint, check_endpoint_or_empty,
             "coordinator worker endpoint [coordinator.worker_endpoint]"),
    WKEY_STR(coordinator_curve_public_key_file, NULL,
             "the coordinator's CURVE public key (worker_curve_keys_file set there) [none]"),
    WKEY_STR(curve_secret_key_file, NULL, "this worker's CURVE secret key [none]"),
    WKEY_INT(heartbeat_ms, 10, 600000, "heartbeat interval [500]"),
    WKEY_INT(prefill_chunk, 1, 65536,
             "tokens per forward call of a long prompt; heartbeats go out between two [32]"),
    WKEY_INT(kv_tokens, 0, 1 << 30,
             "KV cache positions shared by all slots, 0 = every slot at max_seq_len [0]"),
    WKEY_INT(prefix_cache, 0, 1,
             "1: filled KV blocks are kept and a prompt starting with them maps them instead of "
             "computing them again [1]"),
    WKEY_INT(prefix_cache_tokens, 0, 1 << 30,
             "most positions kept in cached blocks no sequence holds, 0 = as many as the pool "
             "has free [0]"),
    WKEY_STR(shm_transport, check_shm_transport,
             "draft's shared buffer: auto (cuda_ipc with backend cuda, else posix), posix, "
             "cuda_ipc [auto]"),
    WKEY_INT(shm_staging, 0, 1,
             "1: cuda_ipc through pinned host memory instead of device memory (the path "
             "without peer access) [0]"),
    WKEY_STR(quantize, check_quantize,
             "the layers' projections quantized as they load: none, int8 or int4 (cpu and cuda; "
             "the embedding and the LM head keep the files' precision) [none]"),
    WKEY_STR(sampler, check_sampler,
             "sampling and accept/reject: device (logits and q rows stay on the GPU), host, "
             "or auto (device with backend cuda, host with cpu) [auto]"),
    WKEY_INT(argmax_copy, 0, 1,
             "1: cpu greedy rows find their argmax from a one-byte copy of the LM head (same "
             "tokens; the copy's memory held); 0: they read the whole head [1]"),
    WKEY_INT(cuda_graphs, 0, 1,
             "1: on cuda, decode and verification steps replay a CUDA graph recorded once per "
             "shape (same bits); 0: every kernel launched one by one [1]"),
    WKEY_STR(log_level, check_log_level, "error|warn|info|debug [info]"),
};

static const struct key_desc supervisor_keys[] = {
    {"mps", KEY_INT, offsetof(struct supervisor_config, mps), 0, 0, 1, NULL,
     "1: tandem-supervisor runs an MPS control daemon for the instance [0]"},
};

#define N_KEYS(a) (sizeof(a) / sizeof((a)[0]))

struct section_desc {
    const char *name;
    size_t offset; /* within struct proc_config */
    const struct key_desc *keys;
    size_t n_keys;
};

static const struct section_desc sections_table[] = {
    {"coordinator", offsetof(struct proc_config, coordinator), coordinator_keys,
     N_KEYS(coordinator_keys)},
    {"draft_worker", offsetof(struct proc_config, draft_worker), worker_keys, N_KEYS(worker_keys)},
    {"target_worker", offsetof(struct proc_config, target_worker), worker_keys,
     N_KEYS(worker_keys)},
    {"gateway", offsetof(struct proc_config, gateway), gateway_keys, N_KEYS(gateway_keys)},
    {"supervisor", offsetof(struct proc_config, supervisor), supervisor_keys,
     N_KEYS(supervisor_keys)},
};

static const struct section_desc *section_find(const char *name, size_t len)
{
    for (size_t i = 0; i < N_KEYS(sections_table); i++)
        if (strlen(sections_table[i].name) == len && strncmp(sections_table[i].name, name, len) == 0)
            return &sections_table[i];
    return NULL;
}

static const struct key_desc *key_find(const struct section_desc *sec, const char *name)
{
    for (size_t i = 0; i < sec->n_keys; i++)
        if (strcmp(sec->keys[i].name, name) == 0)
            return &sec->keys[i];
    return NULL;
}

/* Edit distance (insert, delete, substitute, swap of neighbours) between a
 * and b, stopping at cap + 1: the "did you mean" of an unknown key only
 * cares about near misses. */
static size_t edit_distance(const char *a, const char *b, size_t cap)
{
    enum { N = 64 };
    size_t la = strlen(a), lb = strlen(b);
    if (la >= N || lb >= N || (la > lb ? la - lb : lb - la) > cap)
        return cap + 1;
    size_t d[N][N];
    for (size_t i = 0; i <= la; i++)
        d[i][0] = i;
    for (size_t j = 0; j <= lb; j++)
        d[0][j] = j;
    for (size_t i = 1; i <= la; i++)
        for (size_t j = 1; j <= lb; j++) {
            size_t best = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);
            if (d[i - 1][j] + 1 < best)
                best = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < best)
                best = d[i][j - 1] + 1;
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] && d[i - 2][j - 2] + 1 < best)
                best = d[i - 2][j - 2] + 1;
            d[i][j] = best;
        }
    return d[la][lb];
}

/* " (did you mean \"KEY\"?)" for the key of sec nearest to name (dashes read
 * as underscores), or "" when none is near: at most 2 edits, fewer for
 * short names. Returns out, of KEY_SUGGESTION_SIZE bytes. */
#define KEY_SUGGESTION_SIZE 96
static const char *key_suggestion(const struct section_desc *sec, const char *name, char *out)
{
    char norm[64];
    size_t i;
    for (i = 0; name[i] && i + 1 < sizeof norm; i++)
        norm[i] = name[i] == '-' ? '_' : name[i];
    norm[i] = '\0';
    const size_t cap = strlen(norm) <= 4 ? 1 : 2;
    const char *best = NULL;
    size_t best_d = cap + 1;
    for (size_t k = 0; k < sec->n_keys; k++) {
        size_t dist = edit_distance(norm, sec->keys[k].name, cap);
        if (dist < best_d) {
            best_d = dist;
            best = sec->keys[k].name;
        }
    }
    out[0] = '\0';
    if (best != NULL)
        snprintf(out, KEY_SUGGESTION_SIZE, " (did you mean \"%s\"?)", best);
    return out;
}

static void worker_defaults(struct worker_config *w)
{
    memset(w, 0, sizeof *w);
    snprintf(w->backend, sizeof w->backend, "cpu");
    w->threads = 0;
    w->max_seq_len = 8192;
    w->heartbeat_ms = 500;
    w->prefill_chunk = 32;
    snprintf(w->shm_transport, sizeof w->shm_transport, "auto");
    snprintf(w->sampler, sizeof w->sampler, "auto");
    snprintf(w->quantize, sizeof w->quantize, "none");
    w->argmax_copy = 1;
    w->cuda_graphs = 1;
    w->prefix_cache = 1;
    snprintf(w->log_level, sizeof w->log_level, "info");
}

void proc_config_defaults(struct proc_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->n_pairs = 1;
    snprintf(cfg->instance, sizeof cfg->instance, "tandem");
    struct coordinator_config *c = &cfg->coordinator;
    snprintf(c->client_endpoint, sizeof c->client_endpoint, "tcp://127.0.0.1:5555");
    c->max_concurrency = 8;
    c->max_queue = 64;
    c->heartbeat_ms = 500;
    c->worker_timeout_ms = 3000;
    c->request_timeout_ms = 600000;
    c->max_message_bytes = 1048576;
    c->worker_lane = 1;
    c->spec_k = 0;
    c->spec_k_max = 8;
    snprintf(c->spec_mode, sizeof c->spec_mode, "sampled");
    snprintf(c->draft, sizeof c->draft, "auto");
    snprintf(c->spec_tree, sizeof c->spec_tree, "auto");
    c->suffix_cache_mib = 64;
    snprintf(c->log_level, sizeof c->log_level, "info");
    worker_defaults(&cfg->draft_worker);
    worker_defaults(&cfg->target_worker);
    struct gateway_config *g = &cfg->gateway;
    snprintf(g->listen, sizeof g->listen, "127.0.0.1:8000");
    g->max_body_bytes = 0;
    g->max_connections = 1024;
    g->max_connections_per_ip = 64;
    g->header_timeout_ms = 5000;
    g->body_timeout_ms = 10000;
    g->request_timeout_ms = 600000;
    snprintf(g->log_level, sizeof g->log_level, "info");
}

static int check_instance(const char *value, char *err)
{
    size_t n = strlen(value);
    int ok = n >= 1 && n <= PROC_CONFIG_INSTANCE_MAX;
    for (size_t i = 0; ok && i < n; i++) {
        char ch = value[i];
        ok = (ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
             ch == '_' || ch == '-' || ch == '.';
    }
    if (!ok || strcmp(value, ".") == 0 || strcmp(value, "..") == 0)
        return error_set(err, ERR_INVALID_ARG,
                         "instance: must be 1..%d characters of [A-Za-z0-9_.-], got \"%s\"",
                         PROC_CONFIG_INSTANCE_MAX, value);
    return 0;
}

/* Stores a string value after the key's checks. */
static int key_set_string(void *sec_base, const char *sec_name, const struct key_desc *k,
                          const char *value, char *err)
{
    if (strlen(value) >= k->size)
        return error_set(err, ERR_INVALID_ARG, "%s.%s: longer than %zu bytes", sec_name, k->name,
                         k->size - 1);
    if (k->check) {
        char msg[ERR_MSG_MAX - 128];
        if (k->check(value, msg, sizeof msg) != 0)
            return error_set(err, ERR_INVALID_ARG, "%s.%s: %s", sec_name, k->name, msg);
    }
    memcpy((char *)sec_base + k->offset, value, strlen(value) + 1);
    return 0;
}

static int key_set_int(void *sec_base, const char *sec_name, const struct key_desc *k,
                       long long value, char *err)
{
    if (value < k->min || value > k->max)
        return error_set(err, ERR_INVALID_ARG, "%s.%s: must be in %d..%d, got %lld", sec_name,
                         k->name, k->min, k->max, value);
    *(int *)((char *)sec_base + k->offset) = (int)value;
    return 0;
}

static bool key_is_boolean(const struct key_desc *k)
{
    return k->kind == KEY_INT && k->min == 0 && k->max == 1;
}

/* Integral JSON number within long long range; 0 or -1. */
static int json_integer(const cJSON *item, long long *out)
{
    if (!cJSON_IsNumber(item))
        return -1;
    double v = item->valuedouble;
    if (!isfinite(v) || v != floor(v) || v < -9.0e15 || v > 9.0e15)
        return -1;
    *out = (long long)v;
    return 0;
}

static int key_set_json(void *sec_base, const char *sec_name, const struct key_desc *k,
                        const cJSON *item, char *err)
{
    long long iv;
    switch (k->kind) {
    case KEY_STRING:
        if (!cJSON_IsString(item))
            return error_set(err, ERR_INVALID_ARG, "%s.%s: expected a string, got %s", sec_name,
                             k->name, json_type_name(item));
        return key_set_string(sec_base, sec_name, k, item->valuestring, err);
    case KEY_INT:
        /* a 0/1 key is a boolean: true and false mean what they say */
        if (key_is_boolean(k) && cJSON_IsBool(item))
            return key_set_int(sec_base, sec_name, k, cJSON_IsTrue(item) ? 1 : 0, err);
        if (!cJSON_IsNumber(item))
            return error_set(err, ERR_INVALID_ARG, "%s.%s: expected %s, got %s", sec_name, k->name,
                             key_is_boolean(k) ? "true, false, 1 or 0" : "an integer", json_type_name(item));
        if (json_integer(item, &iv) != 0)
            return error_set(err, ERR_INVALID_ARG, "%s.%s: expected an integer, got %g",
                             sec_name, k->name, item->valuedouble);
        return key_set_int(sec_base, sec_name, k, iv, err);
    case KEY_DEVICE:
        if (cJSON_IsString(item))
            return key_set_string(sec_base, sec_name, k, item->valuestring, err);
        if (cJSON_IsNumber(item)) {
            if (json_integer(item, &iv) != 0 || iv < 0 || iv > 1023)
                return error_set(err, ERR_INVALID_ARG,
                                 "%s.%s: expected a device index in 0..1023 or a UUID string, "
                                 "got %g",
                                 sec_name, k->name, item->valuedouble);
            char buf[32];
            snprintf(buf, sizeof buf, "%lld", iv);
            return key_set_string(sec_base, sec_name, k, buf, err);
        }
        return error_set(err, ERR_INVALID_ARG,
                         "%s.%s: expected an integer or a string, got %s", sec_name, k->name,
                         json_type_name(item));
    }
    return error_set(err, ERR_INTERNAL, "%s.%s: bad key kind", sec_name, k->name);
}

static int has_duplicate_before(const cJSON *obj, const cJSON *item)
{
    for (const cJSON *p = obj->child; p && p != item; p = p->next)
        if (p->string && item->string && strcmp(p->string, item->string) == 0)
            return 1;
    return 0;
}

/* Applies the keys of one section object (item) to base, the section's
 * struct; prefix goes before the section's name in messages ("pairs[1]."). */
static int apply_section(void *base, const struct section_desc *sec, const cJSON *item,
                         const char *source, const char *prefix, char *err)
{
    char inner[ERR_MSG_MAX];
    if (!cJSON_IsObject(item))
        return error_set(err, ERR_INVALID_ARG, "%s: %s%s: expected an object, got %s", source,
                         prefix, sec->name, json_type_name(item));
    for (const cJSON *kv = item->child; kv; kv = kv->next) {
        const char *kname = kv->string ? kv->string : "";
        if (has_duplicate_before(item, kv))
            return error_set(err, ERR_INVALID_ARG, "%s: %s%s.%s: duplicate key", source, prefix,
                             sec->name, kname);
        const struct key_desc *k = key_find(sec, kname);
        char hint[KEY_SUGGESTION_SIZE];
        if (!k)
            return error_set(err, ERR_INVALID_ARG, "%s: %s%s.%s: unknown key%s", source, prefix,
                             sec->name, kname, key_suggestion(sec, kname, hint));
        int rc = key_set_json(base, sec->name, k, kv, inner);
        if (rc != 0)
            return error_set(err, rc, "%s: %s%s", source, prefix, inner);
    }
    return 0;
}

/* "pairs": this process's element over its worker sections; every other
 * element's keys are checked on a scratch copy, so a typo in any pair is an
 * error in every process. */
static int apply_pairs(struct proc_config *cfg, const cJSON *pairs, const char *source, char *err)
{
    const int n = cJSON_IsArray(pairs) ? cJSON_GetArraySize(pairs) : 0;
    if (!cJSON_IsArray(pairs) || n < 1 || n > PROC_CONFIG_PAIRS_MAX)
        return error_set(err, ERR_INVALID_ARG,
                         "%s: pairs: expected an array of 1..%d objects (one per draft/target pair), "
                         "got %s%s", source, PROC_CONFIG_PAIRS_MAX, json_type_name(pairs),
                         cJSON_IsArray(pairs) ? " of another length" : "");
    cfg->n_pairs = n;
    int i = 0;
    for (const cJSON *el = pairs->child; el; el = el->next, i++) {
        char prefix[32];
        snprintf(prefix, sizeof prefix, "pairs[%d].", i);
        if (!cJSON_IsObject(el))
            return error_set(err, ERR_INVALID_ARG, "%s: pairs[%d]: expected an object, got %s", source,
                             i, json_type_name(el));
        for (const cJSON *part = el->child; part; part = part->next) {
            const char *name = part->string ? part->string : "";
            const bool draft = strcmp(name, "draft_worker") == 0;
            if ((!draft && strcmp(name, "target_worker") != 0) || has_duplicate_before(el, part))
                return error_set(err, ERR_INVALID_ARG, "%s: %s%s: %s", source, prefix, name,
                                 draft || strcmp(name, "target_worker") == 0
                                     ? "duplicate key"
                                     : "unknown key (a pair has draft_worker and target_worker)");
            struct worker_config scratch = draft ? cfg->draft_worker : cfg->target_worker;
            struct worker_config *w = i != cfg->pair ? &scratch : draft ? &cfg->draft_worker : &cfg->target_worker;
            int rc = apply_section(w, section_find(name, strlen(name)), part, source, prefix, err);
            if (rc != 0)
                return rc;
        }
    }
    return 0;
}

int proc_config_load_json(struct proc_config *cfg, const char *json_text, const char *source,
                          char *err)
{
    char inner[ERR_MSG_MAX];
    int rc = 0;
    if (!source)
        source = "config";
    const cJSON *pairs = NULL;
    cJSON *root = cJSON_Parse(json_text);
    if (!root) {
        const char *at = cJSON_GetErrorPtr();
        long off = at && at >= json_text ? (long)(at - json_text) : -1;
        return error_set(err, ERR_FORMAT, "%s: not valid JSON (near byte %ld)", source, off);
    }
    if (!cJSON_IsObject(root)) {
        rc = error_set(err, ERR_FORMAT, "%s: expected a JSON object at the top, got %s", source,
                       json_type_name(root));
        goto done;
    }
    for (const cJSON *item = root->child; item; item = item->next) {
        const char *name = item->string ? item->string : "";
        if (has_duplicate_before(root, item)) {
            rc = error_set(err, ERR_INVALID_ARG, "%s: %s: duplicate key", source, name);
            goto done;
        }
        if (strcmp(name, "run_dir") == 0) {
            if (!cJSON_IsString(item)) {
                rc = error_set(err, ERR_INVALID_ARG, "%s: run_dir: expected a string, got %s",
                               source, json_type_name(item));
                goto done;
            }
            if ((rc = proc_config_set(cfg, "run_dir", item->valuestring, inner)) != 0) {
                error_set(err, rc, "%s: %s", source, inner);
                goto done;
            }
            continue;
        }
        if (strcmp(name, "instance") == 0) {
            if (!cJSON_IsString(item)) {
                rc = error_set(err, ERR_INVALID_ARG, "%s: instance: expected a string, got %s",
                               source, json_type_name(item));
                goto done;
            }
            if ((rc = check_instance(item->valuestring, inner)) != 0) {
                error_set(err, rc, "%s: %s", source, inner);
                goto done;
            }
            snprintf(cfg->instance, sizeof cfg->instance, "%s", item->valuestring);
            continue;
        }
        if (strcmp(name, "pairs") == 0) {
            pairs = item; /* after the sections it overrides, wherever it is */
            continue;
        }
        const struct section_desc *sec = section_find(name, strlen(name));
        if (!sec) {
            rc = error_set(err, ERR_INVALID_ARG, "%s: %s: unknown key", source, name);
            goto done;
        }
        if ((rc = apply_section((char *)cfg + sec->offset, sec, item, source, "", err)) != 0)
            goto done;
        if (strcmp(sec->name, "draft_worker") == 0)
            cfg->draft_configured = true;
    }
    if (pairs != NULL)
        rc = apply_pairs(cfg, pairs, source, err);
done:
    cJSON_Delete(root);
    return rc;
}

int proc_config_load_file(struct proc_config *cfg, const char *path, char *err)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return error_set_errno(err, ERR_IO, errno, "%s: cannot open config", path);
    char *buf = malloc(PROC_CONFIG_FILE_MAX_BYTES + 1);
    if (!buf) {
        fclose(f);
        return error_set(err, ERR_NOMEM, "%s: out of memory", path);
    }
    size_t n = fread(buf, 1, PROC_CONFIG_FILE_MAX_BYTES + 1, f);
    int read_error = ferror(f);
    fclose(f);
    int rc;
    if (read_error)
        rc = error_set(err, ERR_IO, "%s: read error", path);
    else if (n > PROC_CONFIG_FILE_MAX_BYTES)
        rc = error_set(err, ERR_FORMAT, "%s: larger than %d bytes", path,
                       PROC_CONFIG_FILE_MAX_BYTES);
    else if (memchr(buf, '\0', n))
        rc = error_set(err, ERR_FORMAT, "%s: contains a NUL byte", path);
    else {
        buf[n] = '\0';
        rc = proc_config_load_json(cfg, buf, path, err);
    }
    free(buf);
    return rc;
}

int proc_config_set(struct proc_config *cfg, const char *key, const char *value, char *err)
{
    char name[128];
    if (!key || !value)
        return error_set(err, ERR_INVALID_ARG, "config key or value missing");
    if (strlen(key) >= sizeof name)
        return error_set(err, ERR_INVALID_ARG, "%.64s...: unknown key", key);
    /* Normalise dashes to underscores. */
    size_t i;
    for (i = 0; key[i]; i++)
        name[i] = key[i] == '-' ? '_' : key[i];
    name[i] = '\0';

    if (strcmp(name, "run_dir") == 0) {
        /* the socket path inside must stay under ipc's 107 bytes */
        if (value[0] != '/' || strlen(value) > 80)
            return error_set(err, ERR_INVALID_ARG,
                             "run_dir: must be an absolute path of at most 80 bytes, got \"%.100s\"",
                             value);
        snprintf(cfg->run_dir, sizeof cfg->run_dir, "%s", value);
        return 0;
    }
    if (strcmp(name, "instance") == 0) {
        int rc = check_instance(value, err);
        if (rc != 0)
            return rc;
        snprintf(cfg->instance, sizeof cfg->instance, "%s", value);
        return 0;
    }
    const char *dot = strchr(name, '.');
    const struct section_desc *sec = dot ? section_find(name, (size_t)(dot - name)) : NULL;
    if (!sec)
        return error_set(err, ERR_INVALID_ARG, "%s: unknown key", name);
    const struct key_desc *k = key_find(sec, dot + 1);
    char hint[KEY_SUGGESTION_SIZE];
    if (!k)
        return error_set(err, ERR_INVALID_ARG, "%s: unknown key%s", name, key_suggestion(sec, dot + 1, hint));
    if (strcmp(sec->name, "draft_worker") == 0)
        cfg->draft_configured = true;
    void *base = (char *)cfg + sec->offset;
    if (key_is_boolean(k) && (strcmp(value, "true") == 0 || strcmp(value, "false") == 0))
        return key_set_int(base, sec->name, k, value[0] == 't', err);
    if (k->kind == KEY_INT) {
        char *end = NULL;
        errno = 0;
        long long v = strtoll(value, &end, 10);
        if (value[0] == '\0' || *end != '\0' || errno == ERANGE)
            return error_set(err, ERR_INVALID_ARG, "%s: expected an integer, got \"%s\"", name,
                             value);
        return key_set_int(base, sec->name, k, v, err);
    }
    return key_set_string(base, sec->name, k, value, err);
}

/* The gateway's body limit against the coordinator's message limit (a body
 * at the limit must reach the coordinator, not be refused there as a message
 * without a request to answer), and its exposure: an address other machines
 * reach needs an API key unless the operator says otherwise, as the
 * coordinator's client endpoint needs CURVE. */
static int finalize_gateway_limits(struct proc_config *cfg, char *err)
{
    struct gateway_config *g = &cfg->gateway;
    const int coord_max = cfg->coordinator.max_message_bytes;
    const int body_max = coord_max - PROC_CONFIG_GATEWAY_ENVELOPE_BYTES;
    if (g->max_body_bytes == 0)
        g->max_body_bytes = body_max;
    else if (g->max_body_bytes > body_max)
        return error_set(err, ERR_INVALID_ARG,
                         "gateway.max_body_bytes: %d is more than the coordinator takes: "
                         "coordinator.max_message_bytes (%d) less %d bytes for the message's envelope "
                         "is %d; lower gateway.max_body_bytes (or leave it out) or raise "
                         "coordinator.max_message_bytes",
                         g->max_body_bytes, coord_max, PROC_CONFIG_GATEWAY_ENVELOPE_BYTES, body_max);
    const bool keyed = g->api_key[0] != '\0' || g->api_key_env[0] != '\0';
    char ep[PROC_CONFIG_NAME_MAX + 8];
    snprintf(ep, sizeof ep, "tcp://%s", g->listen);
    if (!keyed && !g->allow_unauthenticated && !curve_endpoint_is_local(ep))
        return error_set(err, ERR_INVALID_ARG,
                         "gateway.listen: %s can be reached from other machines and no API key is set: "
                         "set gateway.api_key or gateway.api_key_env, or gateway.allow_unauthenticated: 1 "
                         "to serve it to anyone",
                         g->listen);
    if (g->metrics_require_key && !keyed)
        return error_set(err, ERR_INVALID_ARG,
                         "gateway.metrics_require_key: needs a key: set gateway.api_key or gateway.api_key_env");
    if ((g->tls_cert_file[0] == '\0') != (g->tls_key_file[0] == '\0'))
        return error_set(err, ERR_INVALID_ARG, "gateway.%s: set without gateway.%s: HTTPS needs both",
                         g->tls_cert_file[0] != '\0' ? "tls_cert_file" : "tls_key_file",
                         g->tls_cert_file[0] != '\0' ? "tls_key_file" : "tls_cert_file");
    if (g->tls_client_ca_file[0] != '\0' && g->tls_cert_file[0] == '\0')
        return error_set(err, ERR_INVALID_ARG,
                         "gateway.tls_client_ca_file: needs HTTPS: set gateway.tls_cert_file and gateway.tls_key_file");
    return 0;
}

/* A HuggingFace cache snapshot, model[0..n) ending in
 * .../models--ORG--NAME/snapshots/<40 hex> (the last component starting at
 * start): its repository's name, "ORG/NAME", into out. False for any other
 * path (out untouched). The hub writes the repository id with "/" as "--"
 * (the hub refuses "--" inside a name, so the first one is the separator). */
static bool hf_snapshot_name(const char *model, size_t start, size_t n, char *out, size_t out_size)
{
    static const char snap[] = "/snapshots/", repo[] = "models--";
    if (n - start != 40 || start < sizeof snap - 1)
        return false;
    for (size_t i = start; i < n; i++)
        if (!((model[i] >= '0' && model[i] <= '9') || (model[i] >= 'a' && model[i] <= 'f')))
            return false;
    size_t end = start - (sizeof snap - 1); /* the repository folder is model[begin..end) */
    if (strncmp(model + end, snap, sizeof snap - 1) != 0)
        return false;
    size_t begin = end;
    while (begin > 0 && model[begin - 1] != '/')
        begin--;
    if (end - begin <= sizeof repo - 1 || strncmp(model + begin, repo, sizeof repo - 1) != 0)
        return false;
    const char *id = model + begin + sizeof repo - 1;
    const size_t id_len = end - begin - (sizeof repo - 1);
    const char *sep = NULL;
    for (size_t i = 0; i + 1 < id_len; i++)
        if (id[i] == '-' && id[i + 1] == '-') {
            sep = id + i;
            break;
        }
    if (sep == NULL) /* a repository without an organisation ("gpt2") */
        return snprintf(out, out_size, "%.*s", (int)id_len, id) > 0;
    const int org_len = (int)(sep - id), name_len = (int)(id_len - (size_t)org_len - 2);
    if (org_len == 0 || name_len <= 0)
        return false;
    snprintf(out, out_size, "%.*s/%.*s", org_len, id, name_len, sep + 2);
    return true;
}

/* Derived gateway keys: the coordinator endpoint (a wildcard bind address
 * is not something to connect to: it becomes loopback) and the served name. */
static int finalize_gateway(struct proc_config *cfg, char *err)
{
    struct gateway_config *g = &cfg->gateway;
    const struct coordinator_config *c = &cfg->coordinator;
    const bool own_coordinator = g->coordinator_endpoint[0] == '\0';
    if (g->curve_secret_key_file[0] != '\0' && g->coordinator_curve_public_key_file[0] == '\0')
        return error_set(err, ERR_INVALID_ARG,
                         "gateway.curve_secret_key_file: needs gateway.coordinator_curve_public_key_file");
    /* The coordinator of this same config: a mismatch is known now, not at
     * the first request (which the coordinator would refuse). */
    if (own_coordinator && c->curve_secret_key_file[0] != '\0' && g->coordinator_curve_public_key_file[0] == '\0')
        return error_set(err, ERR_INVALID_ARG,
                         "gateway.coordinator_curve_public_key_file: required: the coordinator's client "
                         "endpoint uses CURVE (coordinator.curve_secret_key_file); give the public key file "
                         "that tandem-keygen wrote beside that secret key");
    if (own_coordinator && c->curve_client_keys_file[0] != '\0' && g->curve_secret_key_file[0] == '\0')
        return error_set(err, ERR_INVALID_ARG,
                         "gateway.curve_secret_key_file: required: the coordinator admits only the keys of "
                         "coordinator.curve_client_keys_file; make the gateway a key pair (tandem-keygen) and "
                         "list its public key there");
    if (own_coordinator) {
        const char *ep = c->client_endpoint;
        if (strncmp(ep, "tcp://*:", 8) == 0)
            snprintf(g->coordinator_endpoint, sizeof g->coordinator_endpoint, "tcp://127.0.0.1:%s", ep + 8);
        else if (strncmp(ep, "tcp://0.0.0.0:", 14) == 0)
            snprintf(g->coordinator_endpoint, sizeof g->coordinator_endpoint, "tcp://127.0.0.1:%s", ep + 14);
        else
            snprintf(g->coordinator_endpoint, sizeof g->coordinator_endpoint, "%s", ep);
    }
    char inner[ERR_MSG_MAX];
    if (proc_config_check_endpoint(g->coordinator_endpoint, inner) != 0)
        return error_set(err, ERR_INVALID_ARG, "gateway.coordinator_endpoint: %s", inner);
    int rc = finalize_gateway_limits(cfg, err);
    if (rc != 0)
        return rc;
    if (g->served_model_name[0] == '\0') {
        const char *model = cfg->target_worker.model;
        size_t n = strlen(model);
        while (n > 1 && model[n - 1] == '/')
            n--;
        size_t start = n;
        while (start > 0 && model[start - 1] != '/')
            start--;
        if (hf_snapshot_name(model, start, n, g->served_model_name, sizeof g->served_model_name))
            return 0;
        if (n == 0 || n == start)
            snprintf(g->served_model_name, sizeof g->served_model_name, "tandem");
        else
            snprintf(g->served_model_name, sizeof g->served_model_name, "%.*s", (int)(n - start), model + start);
    }
    return 0;
}

static int finalize_worker(struct proc_config *cfg, struct worker_config *w, const char *sec,
                           char *err)
{
    if (w->model[0] == '\0')
        return error_set(err, ERR_INVALID_ARG, "%s.model: required", sec);
    if (w->coordinator_endpoint[0] == '\0') {
        if (strlen(cfg->coordinator.worker_endpoint) >= sizeof w->coordinator_endpoint)
            return error_set(err, ERR_INTERNAL, "%s.coordinator_endpoint: too long", sec);
        memcpy(w->coordinator_endpoint, cfg->coordinator.worker_endpoint,
               strlen(cfg->coordinator.worker_endpoint) + 1);
    }
    char inner[ERR_MSG_MAX];
    if (proc_config_check_endpoint(w->coordinator_endpoint, inner) != 0)
        return error_set(err, ERR_INVALID_ARG, "%s.coordinator_endpoint: %s", sec, inner);
    if ((w->coordinator_curve_public_key_file[0] != '\0') != (w->curve_secret_key_file[0] != '\0'))
        return error_set(err, ERR_INVALID_ARG,
                         "%s.%s: needs %s.%s too (CURVE to the coordinator takes both)", sec,
                         w->curve_secret_key_file[0] ? "curve_secret_key_file" : "coordinator_curve_public_key_file",
                         sec, w->curve_secret_key_file[0] ? "coordinator_curve_public_key_file" : "curve_secret_key_file");
    const int cuda = strcmp(w->backend, "cuda") == 0;
    if (strcmp(w->sampler, "device") == 0 && !cuda)
        return error_set(err, ERR_INVALID_ARG,
                         "%s.sampler: \"device\" needs backend \"cuda\", the backend is \"%s\" "
                         "(use \"host\" or \"auto\")", sec, w->backend);
    if (strcmp(w->sampler, "auto") == 0)
        snprintf(w->sampler, sizeof w->sampler, "%s", cuda ? "device" : "host");
    return 0;
}

int proc_config_finalize(struct proc_config *cfg, unsigned sections, char *err)
{
    int rc = check_instance(cfg->instance, err);
    if (rc != 0)
        return rc;
    if (cfg->pair >= cfg->n_pairs)
        return error_set(err, ERR_INVALID_ARG,
                         "pair: %d, but the config has %d pair%s (\"pairs\": indices 0..%d)", cfg->pair,
                         cfg->n_pairs, cfg->n_pairs == 1 ? "" : "s", cfg->n_pairs - 1);
    struct coordinator_config *c = &cfg->coordinator;
    if (cfg->run_dir[0] == '\0') {
        /* the user's own runtime directory where the session has one: no
         * other user can plant or squat a name there, as one can under /tmp
         * (where prepare_run_dir then refuses what is not ours) */
        const char *xdg = getenv("XDG_RUNTIME_DIR");
        if (xdg != NULL && xdg[0] == '/')
            snprintf(cfg->run_dir, sizeof cfg->run_dir, "%s/tandem-%s", xdg, cfg->instance);
        else
            snprintf(cfg->run_dir, sizeof cfg->run_dir, "/tmp/tandem-%s", cfg->instance);
    }
    if (c->worker_endpoint[0] == '\0') {
        int n = snprintf(c->worker_endpoint, sizeof c->worker_endpoint, "ipc://%s/workers.sock",
                         cfg->run_dir);
        if (n < 0 || (size_t)n >= sizeof c->worker_endpoint)
            return error_set(err, ERR_INTERNAL, "coordinator.worker_endpoint: too long");
    }
    char inner[ERR_MSG_MAX];
    if (proc_config_check_endpoint(c->worker_endpoint, inner) != 0)
        return error_set(err, ERR_INVALID_ARG, "coordinator.worker_endpoint: %s", inner);
    /* Workers are trusted peers (they name shared memory to map, they see
     * prompts): their endpoint stays on this machine unless the operator
     * says otherwise, with the workers' keys or in the clear. */
    if (!curve_endpoint_is_local(c->worker_endpoint) && !c->external_workers)
        return error_set(err, ERR_INVALID_ARG,
                         "coordinator.worker_endpoint: %s can be reached from other machines: use "
                         "ipc:// or a loopback address, or set coordinator.external_workers: 1 (with "
                         "coordinator.worker_curve_keys_file to admit only the listed workers)",
                         c->worker_endpoint);
    if ((c->worker_curve_keys_file[0] != '\0') != (c->worker_curve_secret_key_file[0] != '\0'))
        return error_set(err, ERR_INVALID_ARG, "coordinator.%s: needs coordinator.%s (CURVE on the worker "
                         "endpoint takes both: its key, and the workers' keys it admits)",
                         c->worker_curve_keys_file[0] ? "worker_curve_keys_file" : "worker_curve_secret_key_file",
                         c->worker_curve_keys_file[0] ? "worker_curve_secret_key_file" : "worker_curve_keys_file");
    if (c->tokenizer[0] == '\0')
        memcpy(c->tokenizer, cfg->target_worker.model, strlen(cfg->target_worker.model) + 1);

    if (sections & PROC_CONFIG_COORDINATOR) {
        if (proc_config_check_endpoint(c->client_endpoint, inner) != 0)
            return error_set(err, ERR_INVALID_ARG, "coordinator.client_endpoint: %s", inner);
        if (c->tokenizer[0] == '\0')
            return error_set(err, ERR_INVALID_ARG,
                             "coordinator.tokenizer: required (or set target_worker.model)");
        if (c->spec_k > c->spec_k_max)
            return error_set(err, ERR_INVALID_ARG,
                             "coordinator.spec_k: must be <= coordinator.spec_k_max (%d), got %d",
                             c->spec_k_max, c->spec_k);
        if (!curve_endpoint_is_local(c->client_endpoint) && c->curve_secret_key_file[0] == '\0' &&
            !c->insecure)
            return error_set(err, ERR_INVALID_ARG,
                             "coordinator.client_endpoint: %s can be reached from other machines: "
                             "set coordinator.curve_secret_key_file (clients then need the server's "
                             "public key) or coordinator.insecure: 1 to serve it in the clear",
                             c->client_endpoint);
        if (c->curve_client_keys_file[0] != '\0' && c->curve_secret_key_file[0] == '\0')
            return error_set(err, ERR_INVALID_ARG,
                             "coordinator.curve_client_keys_file: needs "
                             "coordinator.curve_secret_key_file");
        if (c->worker_timeout_ms <= c->heartbeat_ms)
            return error_set(err, ERR_INVALID_ARG,
                             "coordinator.worker_timeout_ms: must be > coordinator.heartbeat_ms "
                             "(%d), got %d",
                             c->heartbeat_ms, c->worker_timeout_ms);
    }
    if ((sections & PROC_CONFIG_DRAFT) &&
        (rc = finalize_worker(cfg, &cfg->draft_worker, "draft_worker", err)) != 0)
        return rc;
    if ((sections & PROC_CONFIG_TARGET) &&
        (rc = finalize_worker(cfg, &cfg->target_worker, "target_worker", err)) != 0)
        return rc;
    if ((sections & PROC_CONFIG_GATEWAY) && (rc = finalize_gateway(cfg, err)) != 0)
        return rc;
    return 0;
}

int proc_config_parse_args(struct proc_config *cfg, int argc, char **argv, const char *section,
                           unsigned sections, char *err)
{
    proc_config_defaults(cfg);
    /* --pair and --config first, wherever they are, so flags override the
     * file and the file's "pairs" know which element is this process's. */
    const char *config_path = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--pair") == 0 || strncmp(argv[i], "--pair=", 7) == 0) {
            const char *v = argv[i][6] == '=' ? argv[i] + 7 : i + 1 < argc ? argv[++i] : NULL;
            char *end = NULL;
            long p = v != NULL ? strtol(v, &end, 10) : -1;
            if (v == NULL || v[0] == '\0' || *end != '\0' || p < 0 || p >= PROC_CONFIG_PAIRS_MAX)
                return error_set(err, ERR_INVALID_ARG, "--pair: expected an index in 0..%d, got \"%s\"",
                                 PROC_CONFIG_PAIRS_MAX - 1, v != NULL ? v : "");
            cfg->pair = (int)p;
        } else if (strcmp(argv[i], "--config") == 0) {
            if (i + 1 >= argc)
                return error_set(err, ERR_INVALID_ARG, "--config: missing file name");
            config_path = argv[++i];
        } else if (strncmp(argv[i], "--config=", 9) == 0) {
            config_path = argv[i] + 9;
        }
    }
    int rc;
    if (config_path && (rc = proc_config_load_file(cfg, config_path, err)) != 0)
        return rc;

    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (strcmp(arg, "--config") == 0) {
            i++;
            continue;
        }
        if (strncmp(arg, "--config=", 9) == 0 || strncmp(arg, "--pair=", 7) == 0)
            continue;
        if (strcmp(arg, "--pair") == 0) {
            i++;
            continue;
        }
        if (strncmp(arg, "--", 2) != 0 || arg[2] == '\0')
            return error_set(err, ERR_INVALID_ARG, "%s: unexpected argument (flags are --key value)",
                             arg);
        char key[160];
        const char *value;
        const char *eq = strchr(arg, '=');
        size_t klen = eq ? (size_t)(eq - arg - 2) : strlen(arg + 2);
        if (klen >= 100)
            return error_set(err, ERR_INVALID_ARG, "%.64s: unknown flag", arg);
        char bare[100];
        memcpy(bare, arg + 2, klen);
        bare[klen] = '\0';
        if (eq) {
            value = eq + 1;
        } else {
            if (i + 1 >= argc)
                return error_set(err, ERR_INVALID_ARG, "--%s: missing value", bare);
            value = argv[++i];
        }
        for (char *p = bare; *p; p++)
            if (*p == '-')
                *p = '_';
        if (strchr(bare, '.') || strcmp(bare, "instance") == 0 || strcmp(bare, "run_dir") == 0 ||
            !section || !section[0])
            snprintf(key, sizeof key, "%s", bare);
        else
            snprintf(key, sizeof key, "%s.%s", section, bare);
        if ((rc = proc_config_set(cfg, key, value, err)) != 0)
            return rc;
    }
    return proc_config_finalize(cfg, sections, err);
}

void proc_config_print_usage(FILE *out, const char *section)
{
    fprintf(out, "  --config FILE              JSON config (sections coordinator, draft_worker, "
                 "target_worker, gateway, supervisor); the flags below override it, and take "
                 "underscores too (--max_seq_len)\n");
    fprintf(out, "  --instance NAME            instance name (shm segments, ipc endpoints) [tandem]\n");
    fprintf(out, "  --pair N                   workers: the pair served, an index into the config's "
                 "\"pairs\" [0]\n");
    fprintf(out, "  --run-dir DIR              the instance's private directory, mode 0700 "
                 "[$XDG_RUNTIME_DIR/tandem-<instance>, else /tmp/tandem-<instance>]\n");
    for (size_t s = 0; s < N_KEYS(sections_table); s++) {
        const struct section_desc *sec = &sections_table[s];
        if (section && section[0] && strcmp(section, sec->name) != 0)
            continue;
        for (size_t i = 0; i < sec->n_keys; i++) {
            char flag[96];
            if (section && section[0])
                snprintf(flag, sizeof flag, "--%s", sec->keys[i].name);
            else
                snprintf(flag, sizeof flag, "--%s.%s", sec->name, sec->keys[i].name);
            /* one vocabulary with the other tools: hyphens on the command line
             * (underscores, the JSON keys' spelling, are accepted too) */
            for (char *c = flag; *c; c++)
                if (*c == '_')
                    *c = '-';
            fprintf(out, "  %-26s %s\n", flag, sec->keys[i].help);
        }
    }
}
