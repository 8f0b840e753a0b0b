/* worker_link.h: a worker process's connection to the coordinator, shared by
 * the draft and the target worker.
 *
 * It owns the DEALER socket (ZMQ_IMMEDIATE, sends with DONTWAIT: nothing
 * queues while the coordinator is away) and the worker side of the control
 * protocol that does not depend on the model (docs/protocol-notes.md):
 *   - register, built by the role's callback, repeated every heartbeat_ms
 *     until a "welcome" comes, and every WORKER_LINK_REGISTER_RETRY_MS while
 *     the last one could not be sent;
 *   - heartbeat {role} every heartbeat_ms;
 *   - the connection: a monitor of the socket reports its drops. A drop
 *     means the coordinator is gone (killed, restarted; on one host nothing
 *     else closes the connection): the role drops what it held for it
 *     (on_coordinator_lost), and the link registers again at once, retried
 *     every WORKER_LINK_REGISTER_RETRY_MS until the connection is back, so
 *     a restarted coordinator has its workers within a reconnect interval
 *     of its start. Every register carries "drops", the number of drops so
 *     far: a coordinator that outlived the drop learns from it that the
 *     worker's sequences are gone;
 *   - liveness: any message from the coordinator counts as its heartbeat;
 *     after coordinator.worker_timeout_ms of silence the worker registers
 *     again (a coordinator that froze, or a drop the monitor missed);
 *   - the poll/receive loop: malformed envelopes are answered with an
 *     "error", "welcome"/"heartbeat"/"shutdown"/"refused" are handled here,
 *     every other message goes to the role's handler for its type in arrival
 *     order, and a type the role does not serve is answered with an "error";
 *     between drains it runs one step of the role's queued work
 *     (run_queued), heartbeats included, so a worker busy with a batch
 *     stays heard;
 *   - sending, with the "log once per failing streak" policy: the first
 *     failed send after a success logs a warning, the first success after
 *     failures logs "connected to the coordinator".
 *
 * What it is not: it knows no model and no command but the ones above; the
 * role (draft_worker/, target_worker/) parses and answers its own commands
 * with the helpers below. Single-threaded: everything, callbacks included,
 * runs on the thread that calls worker_link_run.
 */
#ifndef TANDEM_WORKER_LINK_H
#define TANDEM_WORKER_LINK_H

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "model_config.h"
#include "proc_config.h"
#include "protocol.h"
#include "worker_msg.h"

/* The largest message a worker takes over ZeroMQ: a verify with a half of
 * a draft that shares no memory with it, q rows of the Llama 3 vocabulary
 * included (18 rows x 128,256 x 4 bytes = 9.2 MB), with room. */
#define WORKER_LINK_HALF_MESSAGE_MAX ((size_t)64 << 20)
/* A register that could not be sent (socket not connected yet) is retried this often. */
#define WORKER_LINK_REGISTER_RETRY_MS 50

/* One command type a role serves and its handler. The handler answers the
 * coordinator itself (worker_link_send, worker_link_send_error); msg is
 * valid only during the call. */
struct worker_link_command {
    const char *type;
    void (*handle)(void *user, const struct protocol_msg *msg);
};

/* What a role plugs into the link. Borrowed: it must outlive the link
 * (a static const table in the role's source). */
struct worker_link_role {
    /* "draft" | "target": the heartbeat's role and the config section
     * ("<name>_worker") the endpoint and heartbeat_ms come from. */
    const char *name;
    /* Returns a complete register header (see worker_link_register_new),
     * owned by the caller, or NULL when out of memory. Called for every
     * register sent. */
    cJSON *(*build_register)(void *user);
    /* Optional (NULL): called for every "welcome", after the link marked
     * itself welcomed (the target attaches the buffer it names). */
    void (*on_welcome)(void *user, const struct protocol_msg *msg);
    /* The commands the role serves (not welcome, heartbeat, shutdown or
     * refused), ended by an entry with type NULL. A type not listed is
     * answered with an "error". */
    const struct worker_link_command *commands;
    /* Optional (NULL: handlers answer at once). Continuous batching: the
     * handlers only queue their commands, and the link calls this after
     * every drain of the socket to run one step of the queued work (one
     * forward call for all queued sequences), so new commands join between
     * steps. Returns < 0 when nothing is queued, 0 when work remains (the
     * link polls without waiting and calls it again), or a number of
     * milliseconds the role wants to wait for more commands before its next
     * step (the link polls up to that long, then calls it again). */
    long (*run_queued)(void *user);
    /* Optional (NULL: nothing held). Called when the connection to the
     * coordinator drops: the coordinator that sent the commands held so far
     * is gone with its requests, and the one the link registers with next
     * knows none of them (a restarted coordinator starts with every slot
     * free). The role drops its queued work and empties every slot, and
     * sends nothing more about them. */
    void (*on_coordinator_lost)(void *user);
    /* Optional (NULL): called after each heartbeat of the run loop (every
     * heartbeat_ms while it runs), for what the role watches between
     * commands (the target: a draft buffer whose owner is going). */
    void (*on_tick)(void *user);
};

struct worker_link;

/* Connects a DEALER socket to cfg's "<role->name>_worker".coordinator_endpoint
 * (in a ZeroMQ context of its own). Copies what it needs from cfg: the
 * section's coordinator_endpoint and heartbeat_ms, coordinator.worker_timeout_ms
 * and coordinator.max_message_bytes. role is borrowed; user is passed to the
 * callbacks. register_note (copied) is logged after each register sent:
 * "registered with <endpoint> (<register_note>)". Sends nothing yet.
 * ERR_INVALID_ARG (role name is neither "draft" nor "target"), ERR_NOMEM,
 * ERR_SYSTEM naming the zmq call. */
int worker_link_create(struct worker_link **out, const struct proc_config *cfg,
                       const struct worker_link_role *role, void *user, const char *register_note,
                       char *err);

/* The in-process end of a link (docs/one-core.md): a caller that runs the
 * coordinator's scheduler in its own process takes the role's messages
 * here instead of from a socket. Borrowed by the link. */
struct worker_link_local {
    /* One message from the role to the coordinator. header and frames are
     * borrowed for the call (copy what is kept; the link deletes header
     * after). 0, or a negative code, logged like a failed socket send. */
    int (*send)(void *user, const cJSON *header, const struct protocol_frame *frames, int n_frames);
    void *user;
};

/* A link with no socket: worker_link_send hands every message to local.
 * There is no liveness to keep in one process: no heartbeats (keepalive
 * does nothing), no lane, no drops; the caller registers the role once
 * (worker_link_announce), hands it the coordinator's messages
 * (worker_link_deliver) and runs its queued work (worker_link_step).
 * worker_link_run refuses a local link. role and local are borrowed; user
 * is passed to the role's callbacks. 0 or ERR_NOMEM. */
int worker_link_create_local(struct worker_link **out, const struct worker_link_role *role, void *user,
                             const struct worker_link_local *local, char *err);

/* Sends the role's register (with "drops" 0) as worker_link_run's first
 * message would. 0 or worker_link_send's code. */
int worker_link_announce(struct worker_link *link);

/* Hands one message from the coordinator to the role as the run loop
 * does: welcome, heartbeat, shutdown and refused here, a served type to its
 * handler, any other answered with an "error". 1 after a shutdown,
 * ERR_MISMATCH with the reason in err after a refusal, else 0. */
int worker_link_deliver(struct worker_link *link, const struct protocol_msg *m, char *err);

/* One step of the role's queued work: run_queued's value (< 0: nothing is
 * queued), or -1 for a role that answers every command at once. */
long worker_link_step(struct worker_link *link);

/* Registers, then serves until *stop becomes nonzero (signal; returns 0), a
 * "shutdown" arrives (returns 0) or the coordinator refuses the worker
 * (ERR_MISMATCH "refused by the coordinator: <its message>"). Other errors:
 * ERR_SYSTEM (zmq_poll), or what protocol_recv returned other than a
 * malformed message (which is answered and survived), in err. */
int worker_link_run(struct worker_link *link, volatile sig_atomic_t *stop, char *err);

/* Sends a heartbeat if one is due (heartbeat_ms since the last one), and
 * nothing else: it neither receives nor dispatches. For a role in the middle
 * of a long command (a prefill fed in chunks, specdec_progress): the
 * coordinator's liveness of this worker then does not depend on how long a
 * command takes, while a worker that is truly stuck still goes silent. Same
 * thread as worker_link_run (it is called from inside a command handler). */
void worker_link_keepalive(struct worker_link *link);

/* Closes the socket and terminates its context. NULL-safe. */
void worker_link_destroy(struct worker_link *link);

/* Sends header (+ frames, borrowed) to the coordinator without blocking and
 * deletes header, whatever happens. header NULL stands for a message that
 * could not be built: logs "out of memory building a message", returns
 * ERR_NOMEM. Returns 0 or protocol_send's code; failures are logged once per
 * streak (see the top of this file), never passed to an err buffer. */
int worker_link_send(struct worker_link *link, cJSON *header, const struct protocol_frame *frames,
                     int n_frames);

/* Logs a warning and sends error {req, slot, code (the lower-case
 * error_name of code), message, in_reply_to}. seq NULL: the command was too
 * malformed to name its request (req and slot go out as -1). */
void worker_link_send_error(struct worker_link *link, const char *in_reply_to,
                            const struct worker_msg_seq *seq, int code, const char *message);

/* A register header (worker_msg_register) with this process's pid, the
 * model facts from mc and the cores it computes on (cpu, not present on a
 * GPU backend), and the pair it serves. The draft adds its "shm" descriptor. NULL when out of
 * memory. */
struct worker_link_facts {
    const char *model, *backend;    /* as the worker's config names them */
    const struct model_config *mc;
    int max_seq_len, n_slots;
    int kv_blocks, kv_block_size;   /* the paged KV pool all slots share */
    const struct worker_msg_cpu *cpu;
};
cJSON *worker_link_register_new(const char *role, const struct worker_link_facts *f, int pair);

#endif
