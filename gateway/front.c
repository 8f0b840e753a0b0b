/* front.c: the accept loop in front of libmicrohttpd (see front.h).
 *
 * Invariants: a slot's socket is in the epoll set while the slot holds it;
 * a socket leaves the slot either closed (admit_leave with it) or handed to
 * libmicrohttpd (then the server leaves admit when libmicrohttpd closes
 * it). Everything but front_handed_closed runs on the front's thread. */
#define _GNU_SOURCE
#include "front.h"

#include <arpa/inet.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "error.h"
#include "head_check.h"
#include "http_reply.h"
#include "logging.h"
#include "tcp_listen.h"
#include "watch.h"

#define FRONT_TAG_LISTEN UINT32_MAX
#define FRONT_TAG_WAKE (UINT32_MAX - 1)
/* The pass that closes expired slots runs at least this often while any
 * slot is held; deadlines are seconds, so 100 ms is exact enough. */
#define FRONT_TICK_MS 100
/* accept past the open-files limit fails until a socket closes: the listen
 * socket is left alone this long rather than polled in a loop */
#define FRONT_ACCEPT_PAUSE_S 0.1
#define FRONT_EVENTS 64

struct front_slot {
    int fd;                 /* -1: free */
    bool lingering;         /* answered: what arrives is dropped until EOF or the deadline */
    double deadline_s;
    uint32_t address;       /* IPv4, network byte order: admit's key */
    struct sockaddr_in addr;
};

struct front {
    struct front_params p;
    int listen_fd, epoll_fd, wake_fd;
    pthread_t thread;
    bool started;
    struct MHD_Daemon *daemon;
    struct front_slot *slots;   /* (max_sockets) */
    unsigned *free_stack;       /* (max_sockets) indices of free slots */
    unsigned n_free;
    atomic_uint handed;         /* sockets libmicrohttpd holds */
    double accept_paused_until_s;
    char peek[HEAD_CHECK_MAX_BYTES + 1];
};

static int epoll_watch(struct front *f, int op, int fd, uint32_t events, uint32_t tag)
{
    struct epoll_event ev = {.events = events, .data.u32 = tag};
    return epoll_ctl(f->epoll_fd, op, fd, &ev);
}

int front_create(struct front **out, const struct front_params *p, char *err)
{
    *out = NULL;
    struct front *f = calloc(1, sizeof(*f));
    if (f == NULL)
        return error_set(err, ERR_NOMEM, "front: out of memory");
    f->p = *p;
    f->listen_fd = f->epoll_fd = f->wake_fd = -1;
    f->slots = calloc(p->max_sockets, sizeof(*f->slots));
    f->free_stack = calloc(p->max_sockets, sizeof(*f->free_stack));
    if (f->slots == NULL || f->free_stack == NULL) {
        front_destroy(f);
        return error_set(err, ERR_NOMEM, "front: out of memory");
    }
    for (unsigned i = 0; i < p->max_sockets; i++) {
        f->slots[i].fd = -1;
        f->free_stack[f->n_free++] = p->max_sockets - 1 - i;
    }
    char addr_text[INET_ADDRSTRLEN + 8] = "?";
    char ip[INET_ADDRSTRLEN];
    if (inet_ntop(AF_INET, &p->addr.sin_addr, ip, sizeof ip) != NULL)
        snprintf(addr_text, sizeof addr_text, "%s:%u", ip, (unsigned)ntohs(p->addr.sin_port));
    char why[ERR_MSG_MAX];
    int rc = tcp_listen_open(&p->addr, SOMAXCONN, addr_text, &f->listen_fd, why);
    if (rc != 0) {
        rc = error_set(err, rc, "front: %s", why);
        front_destroy(f);
        return rc;
    }
    const char *call = NULL;
    if ((f->epoll_fd = epoll_create1(EPOLL_CLOEXEC)) < 0)
        call = "epoll_create1";
    else if ((f->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) < 0)
        call = "eventfd";
    else if (epoll_watch(f, EPOLL_CTL_ADD, f->listen_fd, EPOLLIN, FRONT_TAG_LISTEN) != 0 ||
             epoll_watch(f, EPOLL_CTL_ADD, f->wake_fd, EPOLLIN, FRONT_TAG_WAKE) != 0)
        call = "epoll_ctl";
    if (call != NULL) {
        rc = error_set(err, ERR_SYSTEM, "front: %s: %s", call, strerror(errno));
        front_destroy(f);
        return rc;
    }
    *out = f;
    return 0;
}

/* Closes slot i's socket and frees the slot. */
static void slot_close(struct front *f, unsigned i)
{
    struct front_slot *s = &f->slots[i];
    if (epoll_ctl(f->epoll_fd, EPOLL_CTL_DEL, s->fd, NULL) != 0)
        LOG_WARN("front: epoll_ctl(DEL): %s", strerror(errno));
    if (close(s->fd) != 0)
        LOG_WARN("front: close: %s", strerror(errno));
    admit_leave(f->p.admit, s->address);
    s->fd = -1;
    f->free_stack[f->n_free++] = i;
}

/* Reads and drops what an answered slot's client has sent, and closes it
 * once that was something and nothing more is waiting: the request the
 * answer was for is read, so the close is a FIN and not a reset that could
 * overtake the answer. A client that has sent nothing yet (refused at
 * accept) is waited for, until its deadline. */
static void slot_drain(struct front *f, unsigned i)
{
    char sink[4096];
    bool read_some = false;
    for (;;) {
        ssize_t n = recv(f->slots[i].fd, sink, sizeof sink, 0);
        if (n > 0) {
            read_some = true;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) && !read_some)
            return;
        slot_close(f, i); /* drained, EOF or an error */
        return;
    }
}

/* Answers slot i with e, then drains it (slot_drain), for at most
 * WATCH_LINGER_MS. */
static void slot_refuse(struct front *f, unsigned i, const struct openai_error *e, double now_s)
{
    struct front_slot *s = &f->slots[i];
    http_metrics_request_done(f->p.metrics, HTTP_METRICS_OTHER, e->status);
    if (LOGGING_INFO <= logging_level_current) {
        char addr[INET_ADDRSTRLEN] = "-";
        if (inet_ntop(AF_INET, &s->addr.sin_addr, addr, sizeof addr) == NULL)
            snprintf(addr, sizeof addr, "-");
        LOG_INFO("access: %s \"-\" %d 0.0 ms (refused before libmicrohttpd: %s)", addr, e->status, e->code);
    }
    if (http_reply_error_to_socket(s->fd, e) != 0) {
        slot_close(f, i); /* the client is gone or does not read: nothing to wait for */
        return;
    }
    s->lingering = true;
    s->deadline_s = now_s + WATCH_LINGER_MS / 1000.0;
    slot_drain(f, i);
}

/* Passes slot i's socket to libmicrohttpd; the slot is free after it. */
static void slot_hand_over(struct front *f, unsigned i)
{
    struct front_slot *s = &f->slots[i];
    if (epoll_ctl(f->epoll_fd, EPOLL_CTL_DEL, s->fd, NULL) != 0) {
        LOG_WARN("front: epoll_ctl(DEL): %s", strerror(errno));
        slot_close(f, i);
        return;
    }
    atomic_fetch_add(&f->handed, 1);
    if (MHD_add_connection(f->daemon, s->fd, (const struct sockaddr *)&s->addr, sizeof s->addr) != MHD_YES) {
        /* libmicrohttpd closed it; its close notification is not called */
        LOG_WARN("front: libmicrohttpd did not take a connection (MHD_add_connection): %s", strerror(errno));
        atomic_fetch_sub(&f->handed, 1);
        admit_leave(f->p.admit, s->address);
    }
    s->fd = -1;
    f->free_stack[f->n_free++] = i;
}

/* Slot i may have more of its head: judged again on all of it. */
static void slot_peek(struct front *f, unsigned i, bool peer_done, double now_s)
{
    ssize_t n;
    do
        n = recv(f->slots[i].fd, f->peek, sizeof f->peek, MSG_PEEK);
    while (n < 0 && errno == EINTR);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) && !peer_done)
        return;
    if (n <= 0) {
        slot_close(f, i); /* closed (or broken) before a whole head: nothing to answer */
        return;
    }
    struct openai_error e;
    switch (head_check(f->peek, (size_t)n, &e)) {
    case HEAD_CHECK_OK:
        slot_hand_over(f, i);
        break;
    case HEAD_CHECK_REFUSED:
        slot_refuse(f, i, &e, now_s);
        break;
    case HEAD_CHECK_MORE:
        if (peer_done)
            slot_close(f, i); /* the rest of the head will never come */
        break;
    }
}

/* Accepts what is waiting; each new socket is counted and judged. */
static void accept_all(struct front *f, double now_s)
{
    for (;;) {
        struct sockaddr_in addr;
        socklen_t len = sizeof addr;
        int fd = accept4(f->listen_fd, (struct sockaddr *)&addr, &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED)
                continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK) {
                LOG_WARN("front: accept4: %s (accepting again in %.0f ms)", strerror(errno),
                         FRONT_ACCEPT_PAUSE_S * 1e3);
                f->accept_paused_until_s = now_s + FRONT_ACCEPT_PAUSE_S;
                if (epoll_watch(f, EPOLL_CTL_MOD, f->listen_fd, 0, FRONT_TAG_LISTEN) != 0)
                    LOG_WARN("front: epoll_ctl(MOD): %s", strerror(errno));
            }
            return;
        }
        /* the last guard of the descriptors, as libmicrohttpd's own limit was */
        if (f->n_free == 0 || (f->p.max_sockets - f->n_free) + atomic_load(&f->handed) >= f->p.max_sockets) {
            if (close(fd) != 0)
                LOG_WARN("front: close: %s", strerror(errno));
            continue;
        }
        unsigned i = f->free_stack[--f->n_free];
        struct front_slot *s = &f->slots[i];
        *s = (struct front_slot){.fd = fd, .deadline_s = now_s + f->p.header_timeout_ms / 1000.0,
                                 .address = addr.sin_family == AF_INET ? addr.sin_addr.s_addr : 0, .addr = addr};
        if (epoll_watch(f, EPOLL_CTL_ADD, fd, EPOLLIN | EPOLLRDHUP | EPOLLET, i) != 0) {
            LOG_WARN("front: epoll_ctl(ADD): %s", strerror(errno));
            if (close(fd) != 0)
                LOG_WARN("front: close: %s", strerror(errno));
            s->fd = -1;
            f->free_stack[f->n_free++] = i;
            continue;
        }
        enum admit_verdict v = admit_enter(f->p.admit, s->address);
        if (v != ADMIT_OK) {
            struct openai_error e;
            admit_refusal(f->p.admit, v, &e);
            slot_refuse(f, i, &e, now_s);
            continue;
        }
        slot_peek(f, i, false, now_s);
    }
}

/* Closes the slots past their deadline; resumes accepting after a pause. */
static void expire(struct front *f, double now_s)
{
    for (unsigned i = 0; i < f->p.max_sockets; i++)
        if (f->slots[i].fd >= 0 && now_s >= f->slots[i].deadline_s)
            slot_close(f, i);
    if (f->accept_paused_until_s > 0 && now_s >= f->accept_paused_until_s) {
        f->accept_paused_until_s = 0;
        if (epoll_watch(f, EPOLL_CTL_MOD, f->listen_fd, EPOLLIN, FRONT_TAG_LISTEN) != 0)
            LOG_WARN("front: epoll_ctl(MOD): %s", strerror(errno));
    }
}

static void *front_main(void *arg)
{
    struct front *f = arg;
    struct epoll_event ev[FRONT_EVENTS];
    for (;;) {
        bool idle = f->n_free == f->p.max_sockets && f->accept_paused_until_s == 0;
        int n = epoll_wait(f->epoll_fd, ev, FRONT_EVENTS, idle ? -1 : FRONT_TICK_MS);
        if (n < 0 && errno != EINTR) {
            LOG_ERROR("front: epoll_wait: %s; no new HTTP connection is accepted", strerror(errno));
            return NULL;
        }
        double now_s = watch_now_s();
        for (int k = 0; k < n; k++) {
            uint32_t tag = ev[k].data.u32;
            if (tag == FRONT_TAG_WAKE)
                return NULL;
            if (tag == FRONT_TAG_LISTEN)
                accept_all(f, now_s);
            else if (f->slots[tag].fd < 0)
                continue; /* closed earlier in this pass */
            else if (f->slots[tag].lingering)
                slot_drain(f, tag);
            else
                slot_peek(f, tag, (ev[k].events & (EPOLLRDHUP | EPOLLHUP | EPOLLERR)) != 0, now_s);
        }
        expire(f, now_s);
    }
}

int front_start(struct front *f, struct MHD_Daemon *daemon, char *err)
{
    f->daemon = daemon;
    int rc = pthread_create(&f->thread, NULL, front_main, f);
    if (rc != 0)
        return error_set(err, ERR_SYSTEM, "front: pthread_create: %s", strerror(rc));
    f->started = true;
    return 0;
}

void front_handed_closed(struct front *f)
{
    if (f != NULL)
        atomic_fetch_sub(&f->handed, 1);
}

void front_stop(struct front *f)
{
    if (f == NULL || !f->started)
        return;
    const uint64_t one = 1;
    if (write(f->wake_fd, &one, sizeof one) != (ssize_t)sizeof one)
        LOG_WARN("front: write(eventfd): %s", strerror(errno));
    int rc = pthread_join(f->thread, NULL);
    if (rc != 0)
        LOG_WARN("front: pthread_join: %s", strerror(rc));
    f->started = false;
    for (unsigned i = 0; i < f->p.max_sockets; i++)
        if (f->slots[i].fd >= 0)
            slot_close(f, i);
}

void front_destroy(struct front *f)
{
    if (f == NULL)
        return;
    front_stop(f);
    const int fds[3] = {f->listen_fd, f->epoll_fd, f->wake_fd};
    for (int i = 0; i < 3; i++)
        if (fds[i] >= 0 && close(fds[i]) != 0)
            LOG_WARN("front: close: %s", strerror(errno));
    free(f->slots);
    free(f->free_stack);
    free(f);
}
