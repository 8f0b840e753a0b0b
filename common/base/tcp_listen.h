/* tcp_listen.h: a non-blocking IPv4 listening socket, opened with one rule
 * for what its failures mean.
 *
 * The coordinator's metrics port and the gateway's HTTP front both listen;
 * an operator starting either on an address that is taken, or not this
 * host's, gets the same answer from both: a configuration error naming the
 * call and the address (the supervisor does not restart a process for it:
 * a restart would meet the same address), where a failure of the machine
 * (no file descriptors, no memory) is ERR_SYSTEM.
 */
#ifndef TANDEM_TCP_LISTEN_H
#define TANDEM_TCP_LISTEN_H

#include <netinet/in.h>

/* Opens, binds (SO_REUSEADDR) and listens on sa with `backlog`; *fd_out the
 * socket (non-blocking, close-on-exec), -1 on failure. addr_text names the
 * address in messages. ERR_INVALID_ARG when bind or listen refuse the
 * address (in use: the message says another process listens there),
 * ERR_SYSTEM for socket or setsockopt. */
int tcp_listen_open(const struct sockaddr_in *sa, int backlog, const char *addr_text, int *fd_out,
                    char *err);

#endif
