/* proc_config.h: the one JSON configuration file of the three Tandem processes.
 *
 * One file serves the coordinator, the draft worker and the target worker:
 *   { "instance": "tandem",
 *     "coordinator":   { ... },
 *     "draft_worker":  { ... },
 *     "target_worker": { ... },
 *     "gateway":       { ... } }      (optional: the HTTP gateway, gateway/)
 * Every section and key is optional except the workers' "model" (required
 * only for the sections a process needs). Unknown keys and wrong types are
 * errors naming the key ("coordinator.foo: unknown key",
 * "coordinator.max_concurrency: expected an integer, got string").
 * Command-line flags override file values (proc_config_set, proc_config_parse_args).
 *
 * Lifecycle: proc_config_defaults -> proc_config_load_file / _load_json ->
 * proc_config_set (overrides) -> proc_config_finalize (derived defaults and
 * validation of the sections a process uses). Only after finalize are the
 * derived fields (worker_endpoint, tokenizer, coordinator_endpoint) filled.
 *
 * What it is not: it does not start anything, open sockets or look at model
 * files (it checks only that a model path is given and that endpoints are
 * well formed). The struct is plain data: no allocation, copyable.
 */
#ifndef TANDEM_PROC_CONFIG_H
#define TANDEM_PROC_CONFIG_H

#include <stdbool.h>
#include <stdio.h>

#include "speculate.h"

#define PROC_CONFIG_PATH_MAX 1024
#define PROC_CONFIG_NAME_MAX 64
/* Most draft/target pairs one coordinator drives ("pairs"). */
#define PROC_CONFIG_PAIRS_MAX 8
/* Highest spec_k_max accepted: the most drafts a round can carry. */
#define PROC_CONFIG_SPEC_K_LIMIT SPECULATE_K_MAX

struct coordinator_config {
    char client_endpoint[PROC_CONFIG_PATH_MAX];  /* default tcp://127.0.0.1:5555 */
    char worker_endpoint[PROC_CONFIG_PATH_MAX];  /* default ipc://<run_dir>/workers.sock */
    char tokenizer[PROC_CONFIG_PATH_MAX];        /* model dir with tokenizer.json; default target_worker.model */
    int max_concurrency;      /* sequences in flight (= worker slots), default 8 */
    int max_queue;            /* requests waiting beyond max_concurrency, default 64 */
    int heartbeat_ms;         /* default 500 */
    int worker_timeout_ms;    /* worker declared dead after this silence, default 3000 */
    int request_timeout_ms;   /* default 600000 */
    int max_message_bytes;    /* largest accepted ZeroMQ message, default 1048576 */
    int spec_k;               /* 0 = adaptive */
    int spec_k_max;           /* default 8, at most PROC_CONFIG_SPEC_K_LIMIT */
    char spec_mode[PROC_CONFIG_NAME_MAX];  /* "sampled" (default) or "point_mass" */
    char draft[PROC_CONFIG_NAME_MAX];      /* requests without "draft": auto (default)|model|ngram|suffix|none */
    char spec_tree[PROC_CONFIG_NAME_MAX];  /* requests without "spec_tree": auto (default)|off|2..32 */
    int suffix_cache_mib;                  /* the suffix cache's byte budget in MiB, 0 = off (default 64) */
    char log_level[PROC_CONFIG_NAME_MAX];  /* "error" | "warn" | "info" (default) | "debug" */
    /* Exposure (docs/operations.md). A client endpoint reachable from other
     * machines needs CURVE (the secret key file) or insecure = 1. */
    char curve_secret_key_file[PROC_CONFIG_PATH_MAX];  /* "" = no CURVE */
    char curve_client_keys_file[PROC_CONFIG_PATH_MAX]; /* "" = any client with the server key */
    int insecure;                /* 1: serve a non-loopback client endpoint in the clear */
    int external_workers;        /* 1: the worker endpoint may be reachable from elsewhere */
    /* Workers on other hosts (docs/scale-out.md): the worker socket's
     * CURVE secret key and the workers' public keys, one a line; it then
     * admits only these. Both or neither; "" = no CURVE. */
    char worker_curve_secret_key_file[PROC_CONFIG_PATH_MAX];
    char worker_curve_keys_file[PROC_CONFIG_PATH_MAX];
    int max_requests_per_client; /* requests in flight per client connection, 0 = no limit */
    int worker_lane;             /* 1 (default): local workers' messages on a direct socket (lane.h) */
    char metrics_listen[PROC_CONFIG_NAME_MAX]; /* host:port of GET /metrics (metrics_http.h); "" = none (default) */
};

struct worker_config {
    char model[PROC_CONFIG_PATH_MAX];      /* HF model directory; required */
    char backend[PROC_CONFIG_NAME_MAX];    /* "cpu" (default) or "cuda" */
    char device[PROC_CONFIG_NAME_MAX];     /* cuda only: index ("1") or UUID string; "" = default.
                                              Ignored with backend "cpu". */
    int threads;                           /* cpu threads, 0 = one per core */
    int max_seq_len;                       /* positions per slot, default 8192 (0 = model's limit) */
    char coordinator_endpoint[PROC_CONFIG_PATH_MAX]; /* default coordinator.worker_endpoint */
    /* CURVE to a coordinator with coordinator.worker_curve_keys_file: its
     * public key (the .pub of its worker_curve_secret_key_file) and this worker's
     * secret key (its .pub listed there). "" = plain ZeroMQ. */
    char coordinator_curve_public_key_file[PROC_CONFIG_PATH_MAX];
    char curve_secret_key_file[PROC_CONFIG_PATH_MAX];
    int heartbeat_ms;                      /* default 500 */
    int prefill_chunk;                     /* tokens per forward call of a long feed, default 32:
                                              a heartbeat can go out between two */
    int kv_tokens;                         /* KV cache positions shared by all slots (paged);
                                              0 = every slot at max_seq_len */
    int prefix_cache;                      /* 1 (default): full KV blocks kept for later
                                              prompts that start with them */
    int prefix_cache_tokens;               /* most positions kept in blocks no sequence
                                              holds; 0 = the pool's free blocks */
    /* The draft's shared buffer (common/wire/shm_buffer.h). shm_transport
     * (read by the draft): "auto" = "cuda_ipc" with backend cuda, else
     * "posix". shm_staging = 1 (on either worker) makes cuda_ipc go through
     * pinned host memory, the path two GPUs without peer access take, so
     * that one GPU can test it. */
    char shm_transport[PROC_CONFIG_NAME_MAX];
    int shm_staging;
    /* Where the worker samples and accepts/rejects: "device" keeps logits,
     * q rows and accept/reject on the GPU (only ids cross; the draft's q
     * rows go straight into the cuda_ipc slab and the target reads them
     * there), "host" downloads logits and samples on the CPU (the reference
     * path). "auto" (default) becomes "device" with backend cuda and "host"
     * with cpu in proc_config_finalize; "device" on cpu is an error. */
    char sampler[PROC_CONFIG_NAME_MAX];
    /* "none" (default) or "int8": the layers' projections quantized at
     * load (common/model/quantize.h); a draft's quantization never changes
     * the output, the target verifies every token */
    char quantize[PROC_CONFIG_NAME_MAX];
    /* 1 (default): on the cpu backend, greedy rows find their argmax from a
     * one-byte copy of the LM head (kernels/cpu/argmax.c: the same tokens,
     * half the head's bytes read per token, the copy's bytes held: 263 MB at
     * the Llama 3.2 1B shape, 394 MB at 3B). 0: no copy; greedy rows read
     * the whole head (a worker that only samples reads it anyway). */
    int argmax_copy;
    int cuda_graphs;                       /* 1 (default): cuda forward chunks of up to 64
                                              rows replay a graph recorded per shape */
    char log_level[PROC_CONFIG_NAME_MAX];  /* default "info" */
};

#define PROC_CONFIG_KEY_MAX 256

/* Bytes a request's coordinator message may add to its HTTP body (the "v",
 * "type", "id" and "stream" fields): a derived max_body_bytes leaves them
 * room under coordinator.max_message_bytes, and an explicit one larger than
 * that limit less this is refused at start. The gateway still measures each
 * message, since some bodies grow in translation (1e9 becomes 1000000000). */
#define PROC_CONFIG_GATEWAY_ENVELOPE_BYTES 512

struct gateway_config {
    char listen[PROC_CONFIG_NAME_MAX];     /* HTTP host:port, default 127.0.0.1:8000 */
    char coordinator_endpoint[PROC_CONFIG_PATH_MAX]; /* default coordinator.client_endpoint
                                              (a wildcard host becomes 127.0.0.1) */
    char served_model_name[PROC_CONFIG_PATH_MAX]; /* default basename of target_worker.model, or
                                              ORG/NAME when it is a HuggingFace cache snapshot
                                              (.../models--ORG--NAME/snapshots/<40 hex>) */
    char api_key[PROC_CONFIG_KEY_MAX];     /* "" = no key (unless api_key_env names one) */
    char api_key_env[PROC_CONFIG_NAME_MAX];/* environment variable holding the key */
    char coordinator_curve_public_key_file[PROC_CONFIG_PATH_MAX]; /* "" = plain ZeroMQ to the coordinator */
    char curve_secret_key_file[PROC_CONFIG_PATH_MAX]; /* the gateway's own; "" = a fresh pair per start */
    char tls_cert_file[PROC_CONFIG_PATH_MAX];      /* PEM certificate (chain); "" = plain HTTP */
    char tls_key_file[PROC_CONFIG_PATH_MAX];       /* its PEM private key, unencrypted */
    char tls_client_ca_file[PROC_CONFIG_PATH_MAX]; /* PEM CA(s) a client certificate must chain to;
                                                      "" = no client certificate asked */
    int max_body_bytes;                    /* largest request body; 0 (default) = derived in finalize:
                                              coordinator.max_message_bytes less
                                              PROC_CONFIG_GATEWAY_ENVELOPE_BYTES */
    int max_connections;                   /* concurrent HTTP connections, default 1024 */
    int max_connections_per_ip;            /* concurrent connections from one address, default 64,
                                              0 = no limit (behind a proxy on this host) */
    int header_timeout_ms;                 /* a request line and headers, from the connection's
                                              start or its previous response, default 5000 */
    int body_timeout_ms;                   /* a request body once its headers are in, default 10000 */
    int threads;                           /* HTTP event-loop threads, 0 (default) = one per core */
    int request_timeout_ms;                /* silence from the coordinator before a 504, default 600000 */
    int allow_unauthenticated;             /* 1: listen beyond loopback without an API key */
    int metrics_require_key;               /* 1: /metrics needs the API key too */
    int strict_fields;                     /* 1: an unknown request field is a 400; 0 (default):
                                              accepted and named in Tandem-Ignored-Fields */
    char log_level[PROC_CONFIG_NAME_MAX];  /* default "info" */
};

/* Keys only deploy/tandem-supervisor acts on; the processes accept and
 * ignore them, so that one config file serves all. */
struct supervisor_config {
    int mps;   /* 1: run an MPS control daemon for the instance (one GPU, both workers) */
};

struct proc_config {
    /* Several draft/target pairs under one coordinator: the top-level
     * "pairs" is an array of 1..PROC_CONFIG_PAIRS_MAX objects, one per pair,
     * each with optional "draft_worker" and "target_worker" objects whose
     * keys override the sections of the same names for that pair (a pair's
     * own device, say):
     *   "pairs": [ {"target_worker": {"device": 0}, "draft_worker": {"device": 1}},
     *              {"target_worker": {"device": 2}, "draft_worker": {"device": 3}} ]
     * n_pairs is its length (1 without it). A worker process serves pair
     * `pair` (its --pair flag, read before the file): proc_config_load_*
     * apply that element's overrides over draft_worker/target_worker (and
     * check every other element's keys), so the rest of the code sees one
     * pair. The coordinator takes workers of pairs 0..n_pairs-1. */
    int n_pairs;
    int pair;
    char instance[PROC_CONFIG_NAME_MAX];   /* default "tandem"; [A-Za-z0-9_.-], 1..40 chars */
    char run_dir[PROC_CONFIG_PATH_MAX];    /* the instance's private directory (worker socket;
                                              the supervisor's pid files and logs); default
                                              $XDG_RUNTIME_DIR/tandem-<instance>, else
                                              /tmp/tandem-<instance>; absolute */
    /* A "draft_worker" section is in the file (or a draft_worker.* key was
     * set): the deployment has draft workers. Without one it is target-only
     * (the supervisor starts no draft) and the coordinator exports no draft
     * series that would read "down" forever. */
    bool draft_configured;
    struct coordinator_config coordinator;
    struct worker_config draft_worker, target_worker;
    struct gateway_config gateway;
    struct supervisor_config supervisor;
};

/* Sections a process needs validated (bit mask for proc_config_finalize). */
enum proc_config_section {
    PROC_CONFIG_COORDINATOR = 1u << 0,
    PROC_CONFIG_DRAFT = 1u << 1,
    PROC_CONFIG_TARGET = 1u << 2,
    PROC_CONFIG_GATEWAY = 1u << 3,
};

/* Fills every key with its default; derived keys are left "" until finalize. */
void proc_config_defaults(struct proc_config *cfg);

/* Reads the JSON file at path and applies its keys over cfg.
 * ERR_IO (file unreadable), ERR_FORMAT (not JSON / not an object),
 * ERR_INVALID_ARG (unknown key, wrong type, bad value), message naming
 * the key ("<path>: coordinator.foo: unknown key"). cfg may be partly
 * updated on failure. */
int proc_config_load_file(struct proc_config *cfg, const char *path, char *err);

/* Same from a JSON text; source names it in messages (NULL = "config"). */
int proc_config_load_json(struct proc_config *cfg, const char *json_text, const char *source,
                          char *err);

/* Sets one key from a command-line string: key is "instance" or
 * "<section>.<key>" (e.g. "draft_worker.model"); dashes in the key name are
 * accepted for underscores. Integers must be plain decimal. ERR_INVALID_ARG
 * naming the key for unknown keys and bad values. */
int proc_config_set(struct proc_config *cfg, const char *key, const char *value, char *err);

/* Fills derived defaults (worker_endpoint from instance, tokenizer from
 * target_worker.model, workers' coordinator_endpoint from worker_endpoint)
 * and validates the sections in the mask: required model paths, endpoint
 * syntax (tcp://host:port, ipc://path, inproc://name), ranges and enums.
 * ERR_INVALID_ARG with the key named ("draft_worker.model: required"). */
int proc_config_finalize(struct proc_config *cfg, unsigned sections, char *err);

/* Makes sure cfg->run_dir is the instance's private directory before a
 * socket is bound or connected in it: creates it with mode 0700 (parents
 * must exist), or, when it exists, accepts it only if it is a real
 * directory (not a symbolic link), owned by this user, of mode 0700 -- a
 * name under /tmp is predictable and someone else may have planted it.
 * Only when coordinator.worker_endpoint is an ipc:// path inside run_dir
 * (the default); an endpoint placed elsewhere is the operator's choice.
 * ERR_INVALID_ARG naming the directory and what is wrong with it, ERR_SYSTEM
 * for a failing mkdir/lstat. */
int proc_config_prepare_run_dir(const struct proc_config *cfg, char *err);
/* Checks an HTTP listen address "host:port" (port 1..65535; host an IPv4
 * address, "localhost" or "*"/"0.0.0.0" for every interface). */
int proc_config_check_listen(const char *listen, char *err);
/* The IPv4 address to bind of a checked listen address ("*", "0.0.0.0":
 * every interface; "localhost": 127.0.0.1). ERR_INVALID_ARG naming it. */
struct sockaddr_in;
int proc_config_listen_addr(const char *listen, struct sockaddr_in *sa, char *err);

/* Checks a ZeroMQ endpoint: tcp://host:port (port 1..65535 or "*"),
 * ipc://path (path at most 107 bytes), inproc://name. ERR_INVALID_ARG with
 * the reason (without a key: the caller prefixes it). */
int proc_config_check_endpoint(const char *endpoint, char *err);

/* Command line of a process: defaults, then `--pair N` and `--config FILE`
 * (wherever they appear; --pair before the file is read), then every `--key value` / `--key=value` in order. A bare key
 * belongs to `section` ("model" -> "<section>.model"; section NULL or ""
 * requires qualified keys); "instance" and qualified keys
 * ("--coordinator.max_queue 4") work from every process. Then finalize with
 * the sections mask. `--help`/`-h` is not handled here: main checks it first.
 * ERR_INVALID_ARG naming the flag or key. */
int proc_config_parse_args(struct proc_config *cfg, int argc, char **argv, const char *section,
                           unsigned sections, char *err);

/* Prints the keys of a section (or all when section is NULL) with their
 * defaults, for --help. */
void proc_config_print_usage(FILE *out, const char *section);

#endif
