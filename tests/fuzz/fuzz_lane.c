/* fuzz_lane.c: one lane datagram from fuzz bytes, through lane_recv
 * (common/wire/lane.c): the prefix, the header envelope and the frames.
 *
 * Input: the datagram itself, sent on a fresh SOCK_SEQPACKET pair. Oracle:
 * whatever lane_recv accepts is sent again with lane_send and must come back
 * the same (type, header text, frames byte for byte); nothing it refuses may
 * leave the next datagram unreadable. */
#include "fuzz_common.h"

#include <sys/socket.h>

#include "error.h"
#include "lane.h"

#define FUZZ_LANE_MAX 65536

static void same_message(const struct protocol_msg *a, const struct protocol_msg *b)
{
    char *ta = cJSON_PrintUnformatted(a->header), *tb = cJSON_PrintUnformatted(b->header);
    if (!ta || !tb || strcmp(ta, tb) != 0 || strcmp(a->type, b->type) != 0 ||
        a->n_frames != b->n_frames)
        abort();
    for (int i = 0; i < a->n_frames; i++)
        if (a->frame_size_bytes[i] != b->frame_size_bytes[i] ||
            memcmp(a->frame_data[i], b->frame_data[i], a->frame_size_bytes[i]) != 0)
            abort();
    free(ta);
    free(tb);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0 || size > FUZZ_LANE_MAX)
        return 0; /* an empty datagram is the end of a lane; nothing larger is sent */
    int fd[2];
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK, 0, fd) != 0)
        abort();
    static const uint8_t after[] = "after";
    if (send(fd[0], data, size, 0) != (ssize_t)size || send(fd[0], after, sizeof after, 0) < 0)
        abort();
    char err[ERR_MSG_MAX];
    struct protocol_msg m;
    const int rc = lane_recv(fd[1], FUZZ_LANE_MAX, &m, err);
    if (rc != 0 && rc != ERR_PROTOCOL && rc != ERR_NOMEM)
        abort();
    if (rc == 0) {
        /* the prefix is 7 little-endian u32 */
        if (!m.type || m.n_frames < 0 || m.n_frames > PROTOCOL_MAX_FRAMES || m.identity_size != 0 ||
            m.total_bytes != size - 28)
            abort();
        struct protocol_frame frames[PROTOCOL_MAX_FRAMES];
        for (int i = 0; i < m.n_frames; i++)
            frames[i] = (struct protocol_frame){m.frame_data[i], m.frame_size_bytes[i]};
        int again[2];
        if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK, 0, again) != 0)
            abort();
        struct protocol_msg back;
        if (lane_send(again[0], m.header, frames, m.n_frames, err) != 0 ||
            lane_recv(again[1], FUZZ_LANE_MAX, &back, err) != 0)
            abort();
        same_message(&m, &back);
        protocol_msg_free(&back);
        close(again[0]);
        close(again[1]);
    }
    protocol_msg_free(&m);
    /* the datagram was consumed, accepted or not: the next one is whole,
     * and refused as what it is (not a lane datagram) */
    if (lane_recv(fd[1], FUZZ_LANE_MAX, &m, err) != ERR_PROTOCOL || !strstr(err, "outside"))
        abort();
    protocol_msg_free(&m);
    close(fd[0]);
    close(fd[1]);
    return 0;
}
