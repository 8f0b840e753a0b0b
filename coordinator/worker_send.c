/* worker_send.c: see worker_send.h. */
#include "worker_send.h"

#include "error.h"
#include "logging.h"

/* In-process (coord_state.h, struct coord_local): the transport queues a
 * copy, so hdr is deleted by the caller as after a socket's send. */
static int local_send(const struct coordinator *c, const uint8_t *identity, size_t identity_size,
                      const cJSON *hdr, const struct protocol_frame *frames, int n_frames)
{
    return c->local->send(c->local->user, identity, identity_size, hdr, frames, n_frames);
}

/* The reason of a local transport's refusal, as a socket's would read. */
static void local_reason(int rc, char *err)
{
    (void)error_set(err, rc, "the in-process transport did not take it (%s)", error_name(rc));
}

static const char *type_of(const cJSON *hdr)
{
    const char *t = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(hdr, "type"));
    return t != NULL ? t : "?";
}

int worker_send_frames(struct coordinator *c, int pair, enum worker_role role, cJSON *hdr,
                       const struct protocol_frame *frames, int n_frames)
{
    char err[ERR_MSG_MAX];
    struct worker *w = &c->pair[pair].worker[role];
    int rc;
    if (c->local != NULL) {
        if ((rc = local_send(c, w->identity, w->identity_size, hdr, frames, n_frames)) != 0)
            local_reason(rc, err);
    } else {
        rc = w->lane_sending ? lane_send(w->lane_fd, hdr, frames, n_frames, err)
                             : protocol_send(c->workers, w->identity, w->identity_size, hdr, frames,
                                             n_frames, PROTOCOL_DONTWAIT, err);
    }
    if (rc != 0)
        LOG_WARN("%s worker of pair %d: send %s failed: %s", coord_role_name(role), pair, type_of(hdr), err);
    cJSON_Delete(hdr);
    return rc;
}

int worker_send(struct coordinator *c, int pair, enum worker_role role, cJSON *hdr,
                const struct protocol_frame *frame)
{
    return worker_send_frames(c, pair, role, hdr, frame, frame ? 1 : 0);
}

int worker_send_to_identity(struct coordinator *c, const uint8_t *identity, size_t identity_size, cJSON *hdr)
{
    char err[ERR_MSG_MAX];
    int rc;
    if (c->local != NULL) {
        if ((rc = local_send(c, identity, identity_size, hdr, NULL, 0)) != 0)
            local_reason(rc, err);
    } else {
        rc = protocol_send(c->workers, identity, identity_size, hdr, NULL, 0, PROTOCOL_DONTWAIT, err);
    }
    if (rc != 0)
        LOG_WARN("%s not sent: %s", type_of(hdr), err);
    cJSON_Delete(hdr);
    return rc;
}
