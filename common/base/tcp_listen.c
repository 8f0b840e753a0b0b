/* tcp_listen.c: see tcp_listen.h. */
#include "tcp_listen.h"

#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "error.h"
#include "logging.h"

int tcp_listen_open(const struct sockaddr_in *sa, int backlog, const char *addr_text, int *fd_out,
                    char *err)
{
    const int one = 1;
    const char *call = NULL;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        call = "socket";
    else if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0)
        call = "setsockopt(SO_REUSEADDR)";
    else if (bind(fd, (const struct sockaddr *)sa, sizeof *sa) != 0)
        call = "bind";
    else if (listen(fd, backlog) != 0)
        call = "listen";
    if (call == NULL) {
        *fd_out = fd;
        return 0;
    }
    const int e = errno;
    *fd_out = -1;
    if (fd >= 0 && close(fd) != 0)
        LOG_WARN("tcp_listen: close: %s", strerror(errno));
    const int place = strcmp(call, "bind") == 0 || strcmp(call, "listen") == 0;
    return error_set(err, place ? ERR_INVALID_ARG : ERR_SYSTEM, "%s on %s: %s%s", call, addr_text,
                     strerror(e),
                     e == EADDRINUSE ? " (another process listens there: stop it or choose "
                                       "another port)"
                                     : "");
}
