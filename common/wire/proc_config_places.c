/* proc_config_places.c: checks on the places a config names (ZeroMQ
 * endpoints, HTTP listen addresses) and the making of the instance's run
 * directory; see proc_config.h. */
#include "proc_config.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "error.h"

#define PROC_CONFIG_IPC_PATH_MAX 107

int proc_config_check_endpoint(const char *endpoint, char *err)
{
    if (!endpoint || endpoint[0] == '\0')
        return error_set(err, ERR_INVALID_ARG, "empty endpoint");
    if (strncmp(endpoint, "tcp://", 6) == 0) {
        const char *hostport = endpoint + 6;
        const char *colon = strrchr(hostport, ':');
        if (!colon || colon == hostport)
            return error_set(err, ERR_INVALID_ARG,
                             "bad endpoint \"%s\": expected tcp://host:port", endpoint);
        const char *port = colon + 1;
        if (strcmp(port, "*") == 0)
            return 0;
        char *end = NULL;
        errno = 0;
        long p = strtol(port, &end, 10);
        if (port[0] == '\0' || *end != '\0' || errno != 0 || p < 1 || p > 65535)
            return error_set(err, ERR_INVALID_ARG,
                             "bad endpoint \"%s\": port must be 1..65535 or *", endpoint);
        for (const char *h = hostport; h < colon; h++)
            if (*h == '/' || *h == ' ')
                return error_set(err, ERR_INVALID_ARG, "bad endpoint \"%s\": bad host",
                                 endpoint);
        return 0;
    }
    if (strncmp(endpoint, "ipc://", 6) == 0) {
        size_t n = strlen(endpoint + 6);
        if (n == 0)
            return error_set(err, ERR_INVALID_ARG, "bad endpoint \"%s\": empty ipc path",
                             endpoint);
        if (n > PROC_CONFIG_IPC_PATH_MAX)
            return error_set(err, ERR_INVALID_ARG,
                             "bad endpoint \"%s\": ipc path longer than %d bytes", endpoint,
                             PROC_CONFIG_IPC_PATH_MAX);
        return 0;
    }
    if (strncmp(endpoint, "inproc://", 9) == 0) {
        if (endpoint[9] == '\0')
            return error_set(err, ERR_INVALID_ARG, "bad endpoint \"%s\": empty inproc name",
                             endpoint);
        return 0;
    }
    return error_set(err, ERR_INVALID_ARG,
                     "bad endpoint \"%s\": expected tcp://host:port, ipc://path or inproc://name",
                     endpoint);
}

int proc_config_check_listen(const char *listen, char *err)
{
    const char *colon = listen ? strrchr(listen, ':') : NULL;
    if (colon == NULL || colon == listen)
        return error_set(err, ERR_INVALID_ARG, "bad listen address \"%s\": expected host:port", listen ? listen : "");
    char *end = NULL;
    errno = 0;
    long port = strtol(colon + 1, &end, 10);
    if (colon[1] == '\0' || *end != '\0' || errno != 0 || port < 1 || port > 65535)
        return error_set(err, ERR_INVALID_ARG, "bad listen address \"%s\": port must be 1..65535", listen);
    for (const char *h = listen; h < colon; h++)
        if (!((*h >= '0' && *h <= '9') || (*h >= 'a' && *h <= 'z') || (*h >= 'A' && *h <= 'Z') || *h == '.' ||
              *h == '-' || *h == '*'))
            return error_set(err, ERR_INVALID_ARG, "bad listen address \"%s\": bad host", listen);
    return 0;
}

int proc_config_prepare_run_dir(const struct proc_config *cfg, char *err)
{
    const char *ep = cfg->coordinator.worker_endpoint;
    size_t dlen = strlen(cfg->run_dir);
    if (strncmp(ep, "ipc://", 6) != 0 || strncmp(ep + 6, cfg->run_dir, dlen) != 0 ||
        ep[6 + dlen] != '/' || dlen == 0)
        return 0;
    const char *dir = cfg->run_dir;
    if (mkdir(dir, 0700) == 0)
        return 0;
    if (errno != EEXIST)
        return error_set_errno(err, ERR_SYSTEM, errno, "run_dir %s: mkdir", dir);
    struct stat st;
    if (lstat(dir, &st) != 0)
        return error_set_errno(err, ERR_SYSTEM, errno, "run_dir %s: lstat", dir);
    if (S_ISLNK(st.st_mode))
        return error_set(err, ERR_INVALID_ARG,
                         "run_dir %s: is a symbolic link, not a directory of ours; refusing to use "
                         "it (remove it, or set run_dir)", dir);
    if (!S_ISDIR(st.st_mode))
        return error_set(err, ERR_INVALID_ARG, "run_dir %s: exists and is not a directory; refusing "
                         "to use it", dir);
    if (st.st_uid != geteuid())
        return error_set(err, ERR_INVALID_ARG, "run_dir %s: owned by uid %u, not by us (uid %u); "
                         "refusing to use it", dir, (unsigned)st.st_uid, (unsigned)geteuid());
    if ((st.st_mode & 07777) != 0700)
        return error_set(err, ERR_INVALID_ARG, "run_dir %s: mode %04o, must be 0700 (others could "
                         "reach the worker socket); refusing to use it", dir,
                         (unsigned)(st.st_mode & 07777));
    return 0;
}

int proc_config_listen_addr(const char *listen, struct sockaddr_in *sa, char *err)
{
    int rc = proc_config_check_listen(listen, err);
    if (rc != 0)
        return rc;
    const char *colon = strrchr(listen, ':');
    char host[PROC_CONFIG_NAME_MAX];
    if ((size_t)(colon - listen) >= sizeof host)
        return error_set(err, ERR_INVALID_ARG, "bad listen address \"%s\": host too long", listen);
    memcpy(host, listen, (size_t)(colon - listen));
    host[colon - listen] = '\0';
    memset(sa, 0, sizeof *sa);
    sa->sin_family = AF_INET;
    sa->sin_port = htons((uint16_t)atoi(colon + 1));
    if (strcmp(host, "*") == 0 || strcmp(host, "0.0.0.0") == 0)
        sa->sin_addr.s_addr = htonl(INADDR_ANY);
    else if (strcmp(host, "localhost") == 0)
        sa->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    else if (inet_pton(AF_INET, host, &sa->sin_addr) != 1)
        return error_set(err, ERR_INVALID_ARG, "bad listen address \"%s\": \"%s\" is not an IPv4 address", listen,
                         host);
    return 0;
}
