/* protocol.h: Tandem's ZeroMQ message framing, shared by coordinator, workers and client.
 *
 * Every message is multipart: frame 0 is a JSON object (cJSON) with at least
 * {"v":1,"type":"..."}; further frames are binary, little-endian int32 token
 * arrays where a message type says so. On a ROUTER socket each message is
 * preceded by the peer's routing id frame (no empty delimiter: peers are
 * DEALER sockets).
 *
 * Receiving validates the envelope: total size against a limit, frame count,
 * JSON syntax, an object header, "v" == PROTOCOL_VERSION and a string "type".
 * A rejected message is always drained completely (the next receive starts
 * on a message boundary) and, where they were readable, its routing id and
 * parsed header are left in the struct so the caller can answer with an error
 * naming the request. The field getters validate each field's type and range
 * and write "field: expected ..." messages; nothing here asserts on peer data.
 *
 * What it is not: it knows no message semantics (which fields a "verify"
 * has); the coordinator and workers check those with the getters.
 *
 * Threads: like ZeroMQ sockets, one thread per socket.
 */
#ifndef TANDEM_PROTOCOL_H
#define TANDEM_PROTOCOL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#define PROTOCOL_VERSION 1
/* Binary frames after the header that a message may carry. */
#define PROTOCOL_MAX_FRAMES 4
/* Largest ROUTER routing id (ZeroMQ's own limit is 255). */
#define PROTOCOL_IDENTITY_MAX 255

/* Message types (the "type" field). */
#define PROTOCOL_REGISTER "register"
#define PROTOCOL_WELCOME "welcome"
#define PROTOCOL_REFUSED "refused"
#define PROTOCOL_HEARTBEAT "heartbeat"
#define PROTOCOL_DRAFT "draft"
#define PROTOCOL_DRAFT_READY "draft_ready"
#define PROTOCOL_PREFILL "prefill"
#define PROTOCOL_PREFILL_DONE "prefill_done"
#define PROTOCOL_VERIFY "verify"
#define PROTOCOL_VERIFY_MATCHED "verify_matched"
#define PROTOCOL_VERIFY_TREE "verify_tree"
#define PROTOCOL_RUN "run"
#define PROTOCOL_VERIFY_DONE "verify_done"
#define PROTOCOL_RELEASE "release"
#define PROTOCOL_SHUTDOWN "shutdown"
#define PROTOCOL_ERROR "error"
#define PROTOCOL_ATTACH "attach"
#define PROTOCOL_GENERATE "generate"
#define PROTOCOL_TOKEN "token"
#define PROTOCOL_DONE "done"
#define PROTOCOL_STATS "stats"
#define PROTOCOL_LANE "lane"

/* protocol_send flags */
#define PROTOCOL_DONTWAIT 1 /* fail with ERR_UNAVAILABLE instead of blocking */

/* One outgoing binary frame (borrowed). */
struct protocol_frame {
    const void *data;
    size_t size_bytes;
};

/* A received message. Owns header and frame data; free with protocol_msg_free. */
struct protocol_msg {
    uint8_t identity[PROTOCOL_IDENTITY_MAX]; /* ROUTER routing id of the sender */
    size_t identity_size;                    /* 0 when not received on a ROUTER */
    cJSON *header;                           /* parsed frame 0, NULL when unparsable */
    const char *type;                        /* header's "type" (borrowed from header), or NULL */
    int n_frames;                            /* binary frames after the header */
    void *frame_data[PROTOCOL_MAX_FRAMES];   /* malloc'd, suitably aligned for int32 */
    size_t frame_size_bytes[PROTOCOL_MAX_FRAMES];
    size_t total_bytes;                      /* header + frames (routing id excluded) */
};

/* New header object {"v":1,"type":type}; NULL when out of memory. The caller
 * adds fields (cJSON_Add*ToObject) and deletes it with cJSON_Delete. */
cJSON *protocol_header_new(const char *type);

/* Sends [identity] + header (printed unformatted) + frames as one multipart
 * message. identity NULL / identity_size 0 = no routing frame (DEALER side).
 * Every zmq call is checked. flags: PROTOCOL_DONTWAIT.
 * Returns 0; ERR_UNAVAILABLE (would block with DONTWAIT, or the ROUTER has
 * no such peer when ZMQ_ROUTER_MANDATORY is set: EHOSTUNREACH), ERR_CANCELLED
 * (interrupted by a signal, EINTR), ERR_NOMEM, ERR_SYSTEM (other zmq errors).
 * ZeroMQ sends multipart messages atomically: a failure on a later part
 * cannot leave half a message on the wire once the first part was queued. */
int protocol_send(void *socket, const void *identity, size_t identity_size, const cJSON *header,
                  const struct protocol_frame *frames, int n_frames, int flags, char *err);

/* Receives one message into msg (which it first clears; free it afterwards
 * with protocol_msg_free even on failure). with_identity: the socket is a
 * ROUTER (first frame = routing id). max_message_bytes: limit on header +
 * frames. flags: PROTOCOL_DONTWAIT.
 * Returns 0; ERR_TIMEOUT (nothing to receive with DONTWAIT or a ZMQ_RCVTIMEO
 * expiry), ERR_CANCELLED (EINTR), ERR_PROTOCOL (oversized, too many frames,
 * not JSON, not an object, wrong or missing "v", missing "type": message
 * says which; identity and, if it parsed, header are kept), ERR_NOMEM,
 * ERR_SYSTEM. */
int protocol_recv(void *socket, bool with_identity, size_t max_message_bytes, int flags,
                  struct protocol_msg *msg, char *err);

/* Parses size bytes of header JSON into msg->header and checks the envelope
 * ("v", "type") as protocol_recv does: ERR_PROTOCOL with the reason (the
 * header is kept if it parsed). For transports other than ZeroMQ (lane.h). */
int protocol_msg_parse_header(struct protocol_msg *msg, const void *data, size_t size, char *err);
/* The same over a header tree already parsed (an in-process transport's
 * copy): msg owns it from the call on, whatever the result. */
int protocol_msg_adopt_header(struct protocol_msg *msg, cJSON *header, char *err);

/* Frees what msg owns and clears it; NULL-safe, idempotent. */
void protocol_msg_free(struct protocol_msg *msg);

/* Frame index (0 = first frame after the header) as an int32 array of
 * min_count..max_count tokens: ERR_PROTOCOL "<name>: ..." when the frame is
 * missing, its size is not a multiple of 4 or the count is out of range.
 * *tokens points into msg (valid until protocol_msg_free). */
int protocol_frame_tokens(const struct protocol_msg *msg, int index, const char *name,
                          int min_count, int max_count, const int32_t **tokens, int *n_tokens,
                          char *err);

/* Field getters. `field` is looked up in obj; when it contains dots, the
 * lookup key is the part after the last dot and the whole string is used in
 * messages ("sampling.top_k" looks up "top_k" in the sampling object).
 * Required getters return ERR_PROTOCOL "field: required" when absent; the
 * _opt variants store dflt instead. Wrong type: "field: expected an integer,
 * got string"; range: "field: must be in lo..hi, got v" (or "must be >= lo"
 * when hi is the type's maximum). A JSON null counts as a wrong type. */
int protocol_get_int(const cJSON *obj, const char *field, int lo, int hi, int *out, char *err);
int protocol_get_int_opt(const cJSON *obj, const char *field, int lo, int hi, int dflt, int *out,
                         char *err);
int protocol_get_i64(const cJSON *obj, const char *field, int64_t lo, int64_t hi, int64_t *out,
                     char *err);
int protocol_get_i64_opt(const cJSON *obj, const char *field, int64_t lo, int64_t hi,
                         int64_t dflt, int64_t *out, char *err);
int protocol_get_double(const cJSON *obj, const char *field, double lo, double hi, double *out,
                        char *err);
int protocol_get_double_opt(const cJSON *obj, const char *field, double lo, double hi,
                            double dflt, double *out, char *err);
int protocol_get_bool(const cJSON *obj, const char *field, bool *out, char *err);
int protocol_get_bool_opt(const cJSON *obj, const char *field, bool dflt, bool *out, char *err);
/* *out borrows the string inside obj. max_len: longest accepted strlen. */
int protocol_get_string(const cJSON *obj, const char *field, size_t max_len, const char **out,
                        char *err);
int protocol_get_string_opt(const cJSON *obj, const char *field, size_t max_len,
                            const char *dflt, const char **out, char *err);
/* Object-valued field; *out borrows it. */
int protocol_get_object(const cJSON *obj, const char *field, const cJSON **out, char *err);
int protocol_get_object_opt(const cJSON *obj, const char *field, const cJSON **out, char *err);
/* Array of integers in lo..hi, at most max_count of them, into out. */
int protocol_get_int_array(const cJSON *obj, const char *field, int lo, int hi, int32_t *out,
                           int max_count, int *n_out, char *err);

/* ERR_PROTOCOL "<prefix>.<key>: unknown field" (or "<key>: unknown field"
 * with prefix NULL) for the first key of obj not in the NULL-terminated
 * allowed list. */
int protocol_check_fields(const cJSON *obj, const char *const *allowed, const char *prefix,
                          char *err);

/* Opens a DEALER socket in zctx connected to endpoint, set up for a worker
 * or client: linger 0, ZMQ_IMMEDIATE (no queueing while disconnected),
 * reconnect every 100 ms backing off to 250 ms (a coordinator restarted by
 * the supervisor is back within a second, and each 250 ms of backoff is
 * 250 ms more before its workers are: an attempt at a local endpoint costs
 * microseconds). With curve_server_public (Z85), a CURVE client of that
 * server with the key pair of curve_secret (curve_client_setup). ERR_SYSTEM
 * naming the call. */
int protocol_dealer_connect(void *zctx, const char *endpoint, const char *curve_server_public,
                            const char *curve_secret, void **out_socket, char *err);

/* Monotonic clock in milliseconds (for heartbeats and timings). */
double protocol_now_ms(void);

#endif
