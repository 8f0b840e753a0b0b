/* lane.h: a direct local socket between the coordinator and one worker on
 * its host, for the messages of the speculation rounds.
 *
 * Why: a ZeroMQ ipc message wakes three threads (the sender's I/O thread,
 * the receiver's I/O thread, then the receiving thread), a Unix socket one.
 * On this project's 2-core VM a ZeroMQ round trip between two idle
 * processes took 284-312 us against 15 us for a pipe, and in a debug-timed
 * pipeline run each hop coordinator <-> worker took 0.15-0.35 ms, four hops
 * a drafting round.
 *
 * A lane is a SOCK_SEQPACKET Unix socket: one datagram per message, in
 * order, with an end-of-file when the peer process dies. The coordinator
 * listens beside its ipc:// worker endpoint (lane_path_for) and offers the
 * path and a fresh key in its welcome; the handshake that moves a worker's
 * traffic onto its lane without reordering anything is described in
 * docs/protocol-notes.md ("Lanes"). ZeroMQ stays the transport of
 * registration and of every worker that is not on the coordinator's host.
 *
 * Datagram: a little-endian prefix {magic, header bytes, frame count, up to
 * PROTOCOL_MAX_FRAMES frame sizes}, then the header JSON, then the frames.
 * Every call is non-blocking: a full socket is ERR_UNAVAILABLE, as a
 * ZeroMQ send with PROTOCOL_DONTWAIT.
 */
#ifndef TANDEM_LANE_H
#define TANDEM_LANE_H

#include <stdbool.h>
#include <stddef.h>

#include <cjson/cJSON.h>

#include "protocol.h"

/* Longest lane path (sockaddr_un.sun_path less its terminator). */
#define LANE_PATH_MAX 107
/* Characters of a lane key (hex), without the terminator. */
#define LANE_KEY_LEN 32

/* The lane path for a worker endpoint: "ipc://P" gives "P.lane". false when
 * the endpoint is not ipc:// or the path does not fit out (or sun_path). */
bool lane_path_for(const char *worker_endpoint, char *out, size_t out_size);

/* A fresh random key of LANE_KEY_LEN hex characters into out (at least
 * LANE_KEY_LEN + 1 bytes). ERR_SYSTEM when the kernel gives no randomness. */
int lane_key_new(char *out, char *err);

/* Binds and listens at path (removing a socket file left there), mode 0600.
 * *fd: the non-blocking listening socket. ERR_INVALID_ARG (path too long),
 * ERR_SYSTEM. */
int lane_listen(const char *path, int *fd, char *err);

/* One pending connection (non-blocking, close-on-exec) into *fd, or
 * ERR_TIMEOUT when none waits. ERR_SYSTEM otherwise. */
int lane_accept(int listen_fd, int *fd, char *err);

/* Connects to a lane at path; *fd non-blocking. ERR_INVALID_ARG, ERR_SYSTEM. */
int lane_connect(const char *path, int *fd, char *err);

/* Sizes fd's send buffer for messages of up to max_message_bytes (header and
 * frames). ERR_UNSUPPORTED when the kernel caps the buffer below that
 * (net.core.wmem_max): such a lane cannot carry every message, and a
 * message that had to take the other transport could overtake one sent
 * before it, so the caller does not use the lane at all. */
int lane_fit(int fd, size_t max_message_bytes, char *err);

/* Sends header (printed unformatted) and n_frames frames as one datagram.
 * ERR_UNAVAILABLE (the socket is full), ERR_CANCELLED (the peer is gone),
 * ERR_INVALID_ARG (too many frames), ERR_NOMEM, ERR_SYSTEM. */
int lane_send(int fd, const cJSON *header, const struct protocol_frame *frames, int n_frames,
              char *err);

/* Receives one datagram into msg (cleared first; free it with
 * protocol_msg_free even on failure). ERR_TIMEOUT: nothing waiting.
 * ERR_CANCELLED: the peer closed the lane (end of file). ERR_PROTOCOL:
 * larger than max_message_bytes, a bad prefix, or a bad header (the
 * datagram is consumed either way). ERR_NOMEM, ERR_SYSTEM. */
int lane_recv(int fd, size_t max_message_bytes, struct protocol_msg *msg, char *err);

#endif
