/* bridge.h: the gateway's one connection to the coordinator.
 *
 * What it is: a ZeroMQ DEALER socket to the coordinator's client endpoint
 * (docs/protocol.md), owned by one bridge thread, shared by every HTTP
 * thread through "calls". A call is one request id: messages sent under it
 * carry that id, and the coordinator's replies with that id are queued on
 * the call until its owner takes them. Like vLLM's API server in front of
 * its engine core: HTTP threads never touch the socket.
 * What it is not: a retrying client. When the coordinator is not connected
 * a send fails at once (ZMQ_IMMEDIATE) and the call receives a synthetic
 * error reply of code "coordinator_unavailable"; when the connection drops
 * (the coordinator died or restarted: at once; it froze: within 5 s of
 * missed ZMTP heartbeats), every call that had sent something gets that same
 * reply: its request died with the coordinator.
 *
 * Threads: every function may be called from any thread; one call is used
 * by one thread at a time. Errors: 0 or a negative code from error.h, the
 * reason in err.
 */
#ifndef TANDEM_GATEWAY_BRIDGE_H
#define TANDEM_GATEWAY_BRIDGE_H

#include <stdbool.h>
#include <stddef.h>

#include <cjson/cJSON.h>

/* Code of the synthetic error reply a call gets when a send fails. */
#define BRIDGE_UNAVAILABLE_CODE "coordinator_unavailable"

struct bridge;
struct bridge_call;

/* Connects to endpoint and starts the bridge thread. server_public: the
 * coordinator's CURVE public key (Z85), NULL for plain ZeroMQ; client_secret:
 * the gateway's CURVE secret key, NULL for a fresh pair. max_message_bytes:
 * the coordinator's limit (coordinator.max_message_bytes); a message over it
 * is refused here (bridge_call_send), since the coordinator could only answer
 * it with an error. ERR_SYSTEM,
 * ERR_NOMEM, ERR_INVALID_ARG (bad endpoint or key). While the coordinator
 * refuses the handshake, the error replies say why (and the log, once). */
int bridge_create(struct bridge **out, const char *endpoint, const char *server_public, const char *client_secret,
                  size_t max_message_bytes, char *err);
/* Waits up to timeout_ms for the first handshake with the coordinator:
 * true once connected; false when it was refused or the time ran out. A
 * gateway that opened HTTP before would answer its first requests 503. */
bool bridge_wait_connected(struct bridge *b, int timeout_ms);
/* Stops the thread and closes the socket; calls must be closed first. NULL-safe. */
void bridge_destroy(struct bridge *b);

/* A new call with a fresh id ("<prefix>-<n>", unique in this process). */
int bridge_call_open(struct bridge *b, const char *prefix, struct bridge_call **out, char *err);
/* Unregisters the call (replies still arriving for it are dropped) and frees
 * it with its queued replies. NULL-safe. */
void bridge_call_close(struct bridge_call *call);
const char *bridge_call_id(const struct bridge_call *call);

/* Calls fn(arg) each time a reply is queued on the call, on the bridge
 * thread and under the bridge's lock: fn must be quick and must not call
 * into the bridge (the gateway resumes the parked HTTP connection). Set it
 * before the first send; arg must stay valid until bridge_call_close has
 * returned (after that fn is never called). */
void bridge_call_set_notify(struct bridge_call *call, void (*fn)(void *arg), void *arg);

/* Queues msg for the coordinator with "id" set to the call's id (msg is
 * modified: the id is added or replaced). ERR_RANGE when the serialized
 * message is over max_message_bytes (err says both sizes; nothing is sent);
 * ERR_NOMEM; a failed delivery arrives as an error reply. */
int bridge_call_send(struct bridge_call *call, cJSON *msg, char *err);
/* Sends {"v":1,"type":"cancel","id":<call id>}. */
int bridge_call_cancel(struct bridge_call *call, char *err);

/* Waits up to timeout_ms (>= 0; 0 = only looks) for the call's next reply.
 * 0 with *reply owned by the caller (cJSON_Delete), or ERR_TIMEOUT. */
int bridge_call_next(struct bridge_call *call, int timeout_ms, cJSON **reply, char *err);

#endif
