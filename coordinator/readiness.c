/* readiness.c: see readiness.h. */
#include "readiness.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "coord_state.h"
#include "logging.h"

static int state_path(const struct coordinator *c, const char *suffix, char *out, size_t size)
{
    int n = snprintf(out, size, "%s/coordinator.state%s", c->cfg.run_dir, suffix);
    return n > 0 && (size_t)n < size ? 0 : -1;
}

void readiness_publish(struct coordinator *c)
{
    /* bit 2p: pair p's draft is up, bit 2p + 1: its target */
    int state = 0;
    for (int p = 0; p < c->n_pairs; p++)
        state |= (c->pair[p].worker[ROLE_DRAFT].up ? 1 : 0) << (2 * p) |
                 (c->pair[p].worker[ROLE_TARGET].up ? 1 : 0) << (2 * p + 1);
    if (state == c->readiness_written || c->cfg.run_dir[0] == '\0')
        return;
    char path[PROC_CONFIG_PATH_MAX + 32], tmp[PROC_CONFIG_PATH_MAX + 32];
    if (state_path(c, "", path, sizeof path) || state_path(c, ".tmp", tmp, sizeof tmp))
        return;
    /* "draft" and "target": pair 0's (what a one-pair supervisor reads) */
    char text[128 + 40 * COORD_PAIRS_MAX];
    int len = snprintf(text, sizeof text, "{\"pid\": %ld, \"draft\": %s, \"target\": %s, \"pairs\": [",
                       (long)getpid(), state & 1 ? "true" : "false", state & 2 ? "true" : "false");
    for (int p = 0; p < c->n_pairs; p++)
        len += snprintf(text + len, sizeof text - (size_t)len, "%s{\"draft\": %s, \"target\": %s}",
                        p > 0 ? ", " : "", state >> (2 * p) & 1 ? "true" : "false",
                        state >> (2 * p + 1) & 1 ? "true" : "false");
    len += snprintf(text + len, sizeof text - (size_t)len, "]}\n");
    const int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) {
        /* no run directory: nobody started us who would read it */
        if (errno != ENOENT && !c->readiness_warned) {
            LOG_WARN("%s: cannot write the workers' state: %s", tmp, strerror(errno));
            c->readiness_warned = true;
        }
        c->readiness_written = state;
        return;
    }
    const bool ok = write(fd, text, (size_t)len) == len;
    const int close_rc = close(fd);
    if (!ok || close_rc != 0 || rename(tmp, path) != 0) {
        if (!c->readiness_warned)
            LOG_WARN("%s: cannot write the workers' state: %s", path, strerror(errno));
        c->readiness_warned = true;
        if (unlink(tmp) != 0 && errno != ENOENT)
            LOG_DEBUG("%s: %s", tmp, strerror(errno));
        return;
    }
    c->readiness_written = state;
}

void readiness_withdraw(struct coordinator *c)
{
    char path[PROC_CONFIG_PATH_MAX + 32];
    if (c->readiness_written < 0 || state_path(c, "", path, sizeof path))
        return;
    if (unlink(path) != 0 && errno != ENOENT)
        LOG_WARN("%s: %s", path, strerror(errno));
}
