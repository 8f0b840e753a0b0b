/* tandem_client.h: a small C client for the Tandem coordinator.
 *
 * What it is: a ZeroMQ DEALER socket connected to the coordinator's client
 * endpoint, plus helpers that build the "generate", "cancel" and "stats" messages of
 * docs/protocol.md and receive the replies (token / done / error / stats) as
 * parsed JSON. One client may have several requests in flight; replies carry
 * the request's "id" so the caller can tell them apart.
 * What it is not: thread-safe (one thread per client, like a ZeroMQ socket)
 * nor a retrying client: a timeout or a lost connection is reported, never
 * hidden (see tandem_client_recv).
 *
 * Errors: 0 or a negative code from common/base/error.h, the reason in err.
 */
#ifndef TANDEM_CLIENT_H
#define TANDEM_CLIENT_H

#include <stdbool.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#define TANDEM_CLIENT_DEFAULT_ENDPOINT "tcp://127.0.0.1:5555"
#define TANDEM_CLIENT_STOP_MAX 8

struct tandem_client;

/* Connects (ZeroMQ connects lazily: a missing coordinator shows up as a
 * receive timeout, not here). Returns 0, ERR_INVALID_ARG (bad endpoint),
 * ERR_SYSTEM or ERR_NOMEM. */
int tandem_client_create(struct tandem_client **out, const char *endpoint, char *err);

/* The same over ZeroMQ CURVE (encrypted, the server authenticated by its
 * key): server_public is the coordinator's public key, client_secret this
 * client's secret key (its public key must be admitted when the server lists
 * client keys), NULL for a fresh key pair of this connection. Keys are Z85
 * strings (40 characters). ERR_INVALID_ARG for a key that is not one. */
int tandem_client_create_curve(struct tandem_client **out, const char *endpoint,
                               const char *server_public, const char *client_secret, char *err);
/* NULL-safe; drops unsent messages. */
void tandem_client_destroy(struct tandem_client *client);

/* A generate request. Fields left at their tandem_client_request_init values
 * are not sent (the coordinator's defaults apply). Exactly one of prompt,
 * chat (one user message), ids must be set. Strings are borrowed. */
struct tandem_client_request {
    const char *id;            /* NULL: "" */
    const char *prompt;
    const char *chat;
    const int32_t *ids;
    int n_ids;
    int max_tokens;            /* 0: default */
    double temperature;        /* NAN: default (any other value is sent, even a bad one) */
    int top_k;                 /* < 0: default */
    double top_p;              /* NAN: default */
    double min_p;              /* NAN: default */
    bool has_seed;
    uint64_t seed;
    const char *stop[TANDEM_CLIENT_STOP_MAX];
    int n_stop;
    bool stream;
    int spec_k;                /* < 0: default */
    const char *spec_mode;     /* NULL: default */
    const char *draft;         /* the draft source (auto|model|ngram|suffix|none); NULL: default */
    double presence_penalty;   /* NAN: default (0) */
    double frequency_penalty;  /* NAN: default (0) */
    double repetition_penalty; /* NAN: default (1) */
    int logprobs;              /* < 0: none; 0..20: each token's logprob and that many top
                                  alternatives ("logprobs" in the token and done replies) */
    int n;                     /* <= 1: one choice (not sent); 2..16 choices, each ending with
                                  its own done (or error) carrying "index" */
    const cJSON *grammar;      /* structured output: the "grammar" object (docs/protocol.md),
                                  copied into the request; NULL: none */
};

void tandem_client_request_init(struct tandem_client_request *req);

/* Builds the request's JSON (caller cJSON_Deletes it). ERR_INVALID_ARG when
 * not exactly one prompt kind is set. */
int tandem_client_request_to_json(const struct tandem_client_request *req, cJSON **out, char *err);

/* Sends one message (any JSON; used for raw and malformed test messages
 * too): send_json serializes msg, send_raw sends len bytes as they are.
 * Never blocks for long: ERR_UNAVAILABLE at once after the coordinator
 * refused this client's handshake (the reason in err, as for
 * tandem_client_recv; until a handshake succeeds, which ZeroMQ retries by
 * itself), and after 10 s when ZeroMQ's queue for an absent coordinator
 * stays full. */
int tandem_client_send_json(struct tandem_client *client, const cJSON *msg, char *err);
int tandem_client_send_raw(struct tandem_client *client, const void *data, size_t len, char *err);

/* Sends a generate request. With n > 1 the request is pending until each
 * choice's final reply was read (a done or error with its "index"), or an
 * error without an index (the whole request failed). */
int tandem_client_generate(struct tandem_client *client, const struct tandem_client_request *req,
                           char *err);

/* Sends {"v":1,"type":"cancel","id":id}: the coordinator stops that request
 * of this client at once, frees its slot and answers with an error reply of
 * code "cancelled" (nothing when no such request is running any more). */
int tandem_client_cancel(struct tandem_client *client, const char *id, char *err);

enum tandem_client_event_type {
    TANDEM_CLIENT_EVENT_TOKEN = 0,
    TANDEM_CLIENT_EVENT_DONE = 1,
    TANDEM_CLIENT_EVENT_ERROR = 2,
    TANDEM_CLIENT_EVENT_STATS = 3,
    TANDEM_CLIENT_EVENT_OTHER = 4,
};

/* One reply. json owns the whole message; the string fields point into it
 * ("" when absent). */
struct tandem_client_event {
    enum tandem_client_event_type type;
    const char *id;
    const char *text;          /* token, done */
    const char *code;          /* error */
    const char *message;       /* error */
    cJSON *json;
};

/* Waits up to timeout_ms (< 0: forever) for the next reply. Returns 0,
 * ERR_TIMEOUT, ERR_PROTOCOL (a reply that is not a JSON object with a string
 * "type"), ERR_UNAVAILABLE or ERR_SYSTEM. On 0 the caller frees the event
 * with tandem_client_event_free.
 * ERR_UNAVAILABLE, once per drop: the connection to the coordinator dropped
 * while requests were pending (sent, their done / error / stats reply not
 * read yet; a cancel is not a request). Seen at once when the coordinator
 * was killed or restarted, within 5 s (ZMTP heartbeats) when it froze or the
 * network went dead. The pending requests lost their replies (replies that
 * had arrived are returned first); the client reconnects by itself and new
 * requests are served once the coordinator is back. A coordinator that stays
 * connected but stops answering is caught only by timeout_ms: callers pass a
 * per-reply (idle) timeout, never "forever", when a hang matters.
 * ERR_UNAVAILABLE, "the coordinator refused the connection: <why>", when the
 * handshake failed with requests pending (a CURVE key it does not admit,
 * CURVE on one end only, the wrong server key). */
int tandem_client_recv(struct tandem_client *client, int timeout_ms, struct tandem_client_event *ev,
                       char *err);
void tandem_client_event_free(struct tandem_client_event *ev);

/* *connected: whether a connection to the coordinator has completed its
 * handshake since the client was created (as far as the events read so far
 * tell). A client whose requests wait with this false after a second or two
 * is talking to no coordinator (none runs there, or the endpoint is wrong):
 * ZeroMQ retries in silence. 0, or ERR_SYSTEM when the monitor cannot be read. */
int tandem_client_has_connected(struct tandem_client *client, bool *connected, char *err);

/* Sends {"type":"stats"} and waits for the reply (skipping replies of other
 * kinds). *stats_out is the whole reply (caller cJSON_Deletes it). */
int tandem_client_stats(struct tandem_client *client, int timeout_ms, cJSON **stats_out, char *err);

/* Reads a token-id array ("ids") of an event into a malloc'd array. */
int tandem_client_event_ids(const struct tandem_client_event *ev, int32_t **ids_out, int *n_out,
                            char *err);

#endif
