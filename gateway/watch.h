/* watch.h: what the gateway keeps of each HTTP connection beside what
 * libmicrohttpd keeps: the client's deadlines, and the requests parked while
 * they wait for the coordinator.
 *
 * What it is: one record per connection (made and dropped by libmicrohttpd's
 * connection notifications) and one watcher thread that looks at them every
 * WATCH_TICK_MS.
 * - The client's deadlines. A connection that has not sent its request line
 *   and headers within header_timeout_ms (of its start, or of the end of its
 *   previous response), or its body within body_timeout_ms of its headers, is
 *   shut down (shutdown(2); libmicrohttpd then reads the end and closes it).
 *   libmicrohttpd's own timeout is an idle timeout: a client sending a byte a
 *   second would never meet it.
 * - Parked requests. The HTTP threads are a few event loops (not a thread per
 *   connection), so a request waiting for the coordinator must not block one:
 *   it suspends its connection (watch_park) and returns. A reply (watch_wake,
 *   called by the bridge), a client that hangs up (polled here: libmicrohttpd
 *   does not watch a suspended connection) or the wait's deadline resumes it,
 *   and its handler runs again and looks.
 * What it is not: the connection limits (libmicrohttpd's options) or a timer
 * of the coordinator's silence (each handler checks its own deadline when it
 * runs; the watcher only wakes it then).
 *
 * Threads: any function from any thread, except watch_park: only from the
 * connection's own libmicrohttpd callbacks (access handler, content reader),
 * as MHD_suspend_connection requires. Lock order: the bridge's lock, then
 * the watch's, then libmicrohttpd's (the bridge calls watch_wake under its
 * own lock; nothing here calls into the bridge).
 */
#ifndef TANDEM_GATEWAY_WATCH_H
#define TANDEM_GATEWAY_WATCH_H

#include <stdbool.h>

#include <microhttpd.h>

/* How often deadlines and parked connections are looked at. */
#define WATCH_TICK_MS 50
/* How long a connection answered in the middle of its body still has to
 * read the answer before it is closed (WATCH_CLOSING). */
#define WATCH_LINGER_MS 2000

enum watch_phase {
    WATCH_HEADERS,   /* waiting for a request line and headers: header_timeout_ms */
    WATCH_BODY,      /* receiving a body: body_timeout_ms */
    WATCH_SERVING,   /* the gateway has the request: no deadline on the client */
    WATCH_CLOSING,   /* answered early; what the client still sends is discarded: WATCH_LINGER_MS */
};

enum watch_park {
    WATCH_PARKED,    /* suspended: return from the callback (MHD_YES, or 0 bytes from a reader) */
    WATCH_AGAIN,     /* woken before it could park: look for the reply again */
    WATCH_STOPPING,  /* the gateway stops: end the request */
};

struct watch_params {
    int header_timeout_ms;
    int body_timeout_ms;
};

struct watch;
struct watch_conn;

/* Starts the watcher thread. ERR_NOMEM, ERR_SYSTEM. */
int watch_create(struct watch **out, const struct watch_params *p, char *err);
/* Before MHD_stop_daemon (which must find no suspended connection): resumes
 * every parked connection, and watch_park answers WATCH_STOPPING from now on. */
void watch_stop(struct watch *w);
/* After MHD_stop_daemon: joins the thread and frees. NULL-safe. */
void watch_destroy(struct watch *w);

/* The body of libmicrohttpd's MHD_OPTION_NOTIFY_CONNECTION callback: makes
 * the connection's record (phase WATCH_HEADERS) and drops it. A record that
 * cannot be made (out of memory) shuts the connection down at once. */
void watch_on_connection(struct watch *w, struct MHD_Connection *conn, void **socket_context,
                         enum MHD_ConnectionNotificationCode code);
/* The connection's record; NULL only for one being shut down for want of memory. */
struct watch_conn *watch_conn_of(struct MHD_Connection *conn);
/* Enters a phase; its deadline counts from now. WATCH_HEADERS also drops a
 * wake left over from the previous request. */
void watch_conn_phase(struct watch_conn *c, enum watch_phase phase);

/* True in WATCH_CLOSING: the connection was answered already, and what it
 * still sends is not a request. */
bool watch_conn_closing(struct watch_conn *c);
/* The tokens of the connection's current request, for its access line
 * (server.c): set by the generation as they become known (prompt -1: not
 * known, a stream cut before its end), read when the request ends,
 * cleared by WATCH_HEADERS. The record is the one both see, and it
 * outlives the stream (held) and the access line. watch_conn_usage is
 * false when none was set. */
void watch_conn_set_usage(struct watch_conn *c, int prompt_tokens, int completion_tokens);
bool watch_conn_usage(struct watch_conn *c, int *prompt_tokens, int *completion_tokens);
/* A reference that keeps the record alive after its connection closed: held
 * by whoever registered watch_wake as a bridge notification, released after
 * that bridge call was closed. */
void watch_conn_hold(struct watch_conn *c);
void watch_conn_release(struct watch_conn *c);   /* NULL-safe */

/* Suspends the connection until watch_wake, a hang-up or deadline_s
 * (watch_now_s's clock). */
enum watch_park watch_park(struct watch_conn *c, double deadline_s);
/* Resumes the connection if it is parked, else makes its next watch_park
 * answer WATCH_AGAIN. Takes a struct watch_conn * (a bridge notification). */
void watch_wake(void *conn);

/* Seconds on the monotonic clock. */
double watch_now_s(void);

#endif
