/* watch.c: connection records, client deadlines and parked requests (see
 * watch.h).
 *
 * Invariants, under w->mu: a record is in w's list from its connection's
 * start to its close; c->conn is used (suspended, resumed) only while the
 * record is listed; a parked record is resumed exactly once (by a wake, the
 * watcher or watch_stop), so MHD_resume_connection is never called for a
 * connection that is not suspended (libmicrohttpd would then cancel the
 * next suspension instead). shutdown(2) on c->fd is safe while the record is
 * listed: libmicrohttpd calls the close notification before close(2).
 */
#define _GNU_SOURCE /* POLLRDHUP */
#include "watch.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "error.h"
#include "logging.h"

/* Connections cut for a missed deadline are logged in one line at most this often. */
#define WATCH_LOG_EVERY_S 10.0

enum conn_state {
    CONN_RUNNING,   /* libmicrohttpd processes it */
    CONN_PARKED,    /* suspended by watch_park */
};

struct watch_conn {
    struct watch *w;
    struct MHD_Connection *conn; /* NULL once closed */
    int fd;
    int refs;                    /* libmicrohttpd's (until close) + holds */
    bool listed;
    enum conn_state state;
    bool wake;                   /* a wake came while running */
    bool cut;                    /* shut down for a missed deadline */
    enum watch_phase phase;
    double deadline_s;           /* the client's deadline in this phase, 0 = none */
    double park_deadline_s;      /* while parked */
    int usage_prompt, usage_completion; /* the request's tokens; completion -1: none (watch_conn_set_usage) */
    struct watch_conn *prev, *next;
};

struct watch {
    struct watch_params p;
    pthread_mutex_t mu;
    pthread_cond_t cv;           /* the watcher's sleep; signalled to quit */
    bool cv_ready, thread_started;
    pthread_t thread;
    bool quit;
    bool stopping;
    struct watch_conn *head;
    struct pollfd *pfds;         /* the watcher's scratch: parked connections' sockets */
    struct watch_conn **pconns;
    size_t pcap;
    long cut_headers, cut_body;  /* since the last log line */
    double logged_s;
};

double watch_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Under w->mu: the connection is parked and listed. */
static void resume(struct watch_conn *c)
{
    c->state = CONN_RUNNING;
    MHD_resume_connection(c->conn);
}

/* Under w->mu: room for n parked connections in the scratch arrays. */
static bool scratch_fit(struct watch *w, size_t n)
{
    if (n <= w->pcap)
        return true;
    size_t cap = w->pcap ? w->pcap * 2 : 64;
    while (cap < n)
        cap *= 2;
    struct pollfd *pfds = realloc(w->pfds, cap * sizeof(*pfds));
    if (pfds == NULL)
        return false;
    w->pfds = pfds;
    struct watch_conn **pconns = realloc(w->pconns, cap * sizeof(*pconns));
    if (pconns == NULL)
        return false;
    w->pconns = pconns;
    w->pcap = cap;
    return true;
}

/* Under w->mu: shuts down the connections past their deadline. */
static void cut_late(struct watch *w, double now)
{
    for (struct watch_conn *c = w->head; c != NULL; c = c->next) {
        if (c->state != CONN_RUNNING || c->cut || c->deadline_s == 0 || now < c->deadline_s)
            continue;
        /* ENOTCONN: the client is already gone; libmicrohttpd sees that too */
        if (shutdown(c->fd, SHUT_RDWR) != 0 && errno != ENOTCONN)
            LOG_WARN("watch: shutdown of a connection past its deadline: %s", strerror(errno));
        c->cut = true;
        if (c->phase == WATCH_HEADERS)
            w->cut_headers++;
        else if (c->phase == WATCH_BODY)
            w->cut_body++;
    }
    if ((w->cut_headers > 0 || w->cut_body > 0) && now - w->logged_s >= WATCH_LOG_EVERY_S) {
        LOG_INFO("closed %ld connection(s) that did not send their request line and headers within "
                 "gateway.header_timeout_ms (%d) and %ld that did not send their body within "
                 "gateway.body_timeout_ms (%d)",
                 w->cut_headers, w->p.header_timeout_ms, w->cut_body, w->p.body_timeout_ms);
        w->cut_headers = w->cut_body = 0;
        w->logged_s = now;
    }
}

/* Under w->mu: resumes parked connections whose wait is over or whose
 * client hung up (their handler sees which and ends the request). */
static void wake_parked(struct watch *w, double now)
{
    size_t n = 0;
    for (struct watch_conn *c = w->head; c != NULL; c = c->next) {
        if (c->state != CONN_PARKED)
            continue;
        if (now >= c->park_deadline_s) {
            resume(c);
            continue;
        }
        if (!scratch_fit(w, n + 1))
            continue; /* out of memory: its deadline still wakes it */
        w->pfds[n] = (struct pollfd){.fd = c->fd, .events = POLLRDHUP};
        w->pconns[n++] = c;
    }
    if (n == 0)
        return;
    int got = poll(w->pfds, (nfds_t)n, 0);
    if (got < 0) {
        if (errno != EINTR)
            LOG_WARN("watch: poll of parked connections: %s", strerror(errno));
        return;
    }
    for (size_t i = 0; i < n && got > 0; i++) {
        if (w->pfds[i].revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) {
            resume(w->pconns[i]);
            got--;
        }
    }
}

static void *watch_main(void *arg)
{
    struct watch *w = arg;
    pthread_mutex_lock(&w->mu);
    while (!w->quit) {
        double now = watch_now_s();
        cut_late(w, now);
        wake_parked(w, now);
        struct timespec until;
        clock_gettime(CLOCK_MONOTONIC, &until);
        until.tv_nsec += (long)WATCH_TICK_MS * 1000000L;
        if (until.tv_nsec >= 1000000000L) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000L;
        }
        int rc = pthread_cond_timedwait(&w->cv, &w->mu, &until);
        if (rc != 0 && rc != ETIMEDOUT) {
            LOG_ERROR("watch: pthread_cond_timedwait: %s", strerror(rc));
            break;
        }
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

int watch_create(struct watch **out, const struct watch_params *p, char *err)
{
    *out = NULL;
    struct watch *w = calloc(1, sizeof(*w));
    if (w == NULL)
        return error_set(err, ERR_NOMEM, "watch: out of memory");
    w->p = *p;
    int rc = pthread_mutex_init(&w->mu, NULL);
    if (rc != 0) {
        free(w);
        return error_set(err, ERR_SYSTEM, "watch: pthread_mutex_init: %s", strerror(rc));
    }
    pthread_condattr_t attr;
    if ((rc = pthread_condattr_init(&attr)) != 0)
        goto fail;
    /* the tick must not stretch or shrink when the wall clock is set */
    rc = pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    if (rc == 0)
        rc = pthread_cond_init(&w->cv, &attr);
    pthread_condattr_destroy(&attr);
    if (rc != 0)
        goto fail;
    w->cv_ready = true;
    if ((rc = pthread_create(&w->thread, NULL, watch_main, w)) != 0)
        goto fail;
    w->thread_started = true;
    *out = w;
    return 0;
fail:
    watch_destroy(w);
    return error_set(err, ERR_SYSTEM, "watch: starting the watcher thread: %s", strerror(rc));
}

void watch_stop(struct watch *w)
{
    if (w == NULL)
        return;
    pthread_mutex_lock(&w->mu);
    w->stopping = true;
    for (struct watch_conn *c = w->head; c != NULL; c = c->next)
        if (c->state == CONN_PARKED)
            resume(c);
    pthread_mutex_unlock(&w->mu);
}

void watch_destroy(struct watch *w)
{
    if (w == NULL)
        return;
    if (w->thread_started) {
        pthread_mutex_lock(&w->mu);
        w->quit = true;
        pthread_cond_signal(&w->cv);
        pthread_mutex_unlock(&w->mu);
        pthread_join(w->thread, NULL);
    }
    /* libmicrohttpd closed every connection before (MHD_stop_daemon); a
     * record still listed would be a notification it did not send. */
    while (w->head != NULL) {
        struct watch_conn *c = w->head;
        w->head = c->next;
        free(c);
    }
    if (w->cv_ready)
        pthread_cond_destroy(&w->cv);
    pthread_mutex_destroy(&w->mu);
    free(w->pfds);
    free(w->pconns);
    free(w);
}

static void conn_started(struct watch *w, struct MHD_Connection *conn, void **socket_context)
{
    *socket_context = NULL;
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    struct watch_conn *c = ci != NULL ? calloc(1, sizeof(*c)) : NULL;
    if (c == NULL) {
        /* Without a record nothing would bound its deadlines: refuse it. */
        LOG_WARN("watch: out of memory for a new connection; closing it");
        if (ci != NULL && shutdown(ci->connect_fd, SHUT_RDWR) != 0 && errno != ENOTCONN)
            LOG_WARN("watch: shutdown: %s", strerror(errno));
        return;
    }
    c->w = w;
    c->conn = conn;
    c->fd = ci->connect_fd;
    c->refs = 1;
    c->phase = WATCH_HEADERS;
    c->usage_prompt = c->usage_completion = -1;
    c->deadline_s = watch_now_s() + w->p.header_timeout_ms / 1000.0;
    pthread_mutex_lock(&w->mu);
    c->next = w->head;
    if (w->head != NULL)
        w->head->prev = c;
    w->head = c;
    c->listed = true;
    pthread_mutex_unlock(&w->mu);
    *socket_context = c;
}

static void conn_closed(struct watch *w, void **socket_context)
{
    struct watch_conn *c = *socket_context;
    *socket_context = NULL;
    if (c == NULL)
        return;
    pthread_mutex_lock(&w->mu);
    if (c->prev != NULL)
        c->prev->next = c->next;
    else
        w->head = c->next;
    if (c->next != NULL)
        c->next->prev = c->prev;
    c->prev = c->next = NULL;
    c->listed = false;
    c->conn = NULL;
    bool last = --c->refs == 0;
    pthread_mutex_unlock(&w->mu);
    if (last)
        free(c);
}

void watch_on_connection(struct watch *w, struct MHD_Connection *conn, void **socket_context,
                         enum MHD_ConnectionNotificationCode code)
{
    if (code == MHD_CONNECTION_NOTIFY_STARTED)
        conn_started(w, conn, socket_context);
    else if (code == MHD_CONNECTION_NOTIFY_CLOSED)
        conn_closed(w, socket_context);
}

struct watch_conn *watch_conn_of(struct MHD_Connection *conn)
{
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci != NULL ? ci->socket_context : NULL;
}

void watch_conn_phase(struct watch_conn *c, enum watch_phase phase)
{
    struct watch *w = c->w;
    double now = watch_now_s();
    pthread_mutex_lock(&w->mu);
    c->phase = phase;
    switch (phase) {
    case WATCH_HEADERS:
        c->deadline_s = now + w->p.header_timeout_ms / 1000.0;
        c->wake = false;
        c->usage_prompt = c->usage_completion = -1;
        break;
    case WATCH_BODY:
        c->deadline_s = now + w->p.body_timeout_ms / 1000.0;
        break;
    case WATCH_SERVING:
        c->deadline_s = 0;
        break;
    case WATCH_CLOSING:
        c->deadline_s = now + WATCH_LINGER_MS / 1000.0;
        break;
    }
    pthread_mutex_unlock(&w->mu);
}

bool watch_conn_closing(struct watch_conn *c)
{
    pthread_mutex_lock(&c->w->mu);
    bool closing = c->phase == WATCH_CLOSING;
    pthread_mutex_unlock(&c->w->mu);
    return closing;
}

void watch_conn_hold(struct watch_conn *c)
{
    pthread_mutex_lock(&c->w->mu);
    c->refs++;
    pthread_mutex_unlock(&c->w->mu);
}

void watch_conn_release(struct watch_conn *c)
{
    if (c == NULL)
        return;
    pthread_mutex_lock(&c->w->mu);
    bool last = --c->refs == 0;
    pthread_mutex_unlock(&c->w->mu);
    if (last)
        free(c);
}

enum watch_park watch_park(struct watch_conn *c, double deadline_s)
{
    struct watch *w = c->w;
    enum watch_park out = WATCH_PARKED;
    pthread_mutex_lock(&w->mu);
    if (w->stopping || !c->listed) {
        out = WATCH_STOPPING;
    } else if (c->wake) {
        c->wake = false;
        out = WATCH_AGAIN;
    } else {
        c->state = CONN_PARKED;
        c->park_deadline_s = deadline_s;
        MHD_suspend_connection(c->conn);
    }
    pthread_mutex_unlock(&w->mu);
    return out;
}

void watch_wake(void *conn)
{
    struct watch_conn *c = conn;
    struct watch *w = c->w;
    pthread_mutex_lock(&w->mu);
    if (c->listed) {
        if (c->state == CONN_PARKED)
            resume(c);
        else
            c->wake = true;
    }
    pthread_mutex_unlock(&w->mu);
}

void watch_conn_set_usage(struct watch_conn *c, int prompt_tokens, int completion_tokens)
{
    pthread_mutex_lock(&c->w->mu);
    c->usage_prompt = prompt_tokens;
    c->usage_completion = completion_tokens;
    pthread_mutex_unlock(&c->w->mu);
}

bool watch_conn_usage(struct watch_conn *c, int *prompt_tokens, int *completion_tokens)
{
    pthread_mutex_lock(&c->w->mu);
    *prompt_tokens = c->usage_prompt;
    *completion_tokens = c->usage_completion;
    pthread_mutex_unlock(&c->w->mu);
    return *completion_tokens >= 0;
}
