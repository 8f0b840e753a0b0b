/* protocol.c: multipart send/receive with envelope validation, and field getters.
 *
 * Invariant of protocol_recv: whatever goes wrong after the first part has
 * arrived, every remaining part of that message is read and dropped before
 * returning, so the socket is always left on a message boundary.
 */
#include "protocol.h"
#include "json_type.h"

#include <errno.h>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zmq.h>

#include "curve_keys.h"
#include "error.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "protocol.c assumes a little-endian host (token frames are little-endian int32)"
#endif

cJSON *protocol_header_new(const char *type)
{
    cJSON *h = cJSON_CreateObject();
    if (!h)
        return NULL;
    if (!cJSON_AddNumberToObject(h, "v", PROTOCOL_VERSION) ||
        !cJSON_AddStringToObject(h, "type", type)) {
        cJSON_Delete(h);
        return NULL;
    }
    return h;
}

static int send_errno_code(int e)
{
    if (e == EAGAIN || e == EHOSTUNREACH)
        return ERR_UNAVAILABLE;
    if (e == EINTR)
        return ERR_CANCELLED;
    return ERR_SYSTEM;
}

int protocol_send(void *socket, const void *identity, size_t identity_size, const cJSON *header,
                  const struct protocol_frame *frames, int n_frames, int flags, char *err)
{
    if (!socket || !header || n_frames < 0 || n_frames > PROTOCOL_MAX_FRAMES ||
        (n_frames > 0 && !frames))
        return error_set(err, ERR_INVALID_ARG, "protocol_send: bad arguments");
    int dw = (flags & PROTOCOL_DONTWAIT) ? ZMQ_DONTWAIT : 0;
    char *text = cJSON_PrintUnformatted(header);
    if (!text)
        return error_set(err, ERR_NOMEM, "protocol_send: cannot print header");
    int rc = 0;
    if (identity && identity_size > 0) {
        if (zmq_send(socket, identity, identity_size, ZMQ_SNDMORE | dw) < 0) {
            int e = zmq_errno();
            rc = error_set(err, send_errno_code(e), "zmq_send(routing id): %s", zmq_strerror(e));
            goto done;
        }
    }
    if (zmq_send(socket, text, strlen(text), (n_frames > 0 ? ZMQ_SNDMORE : 0) | dw) < 0) {
        int e = zmq_errno();
        rc = error_set(err, send_errno_code(e), "zmq_send(header): %s", zmq_strerror(e));
        goto done;
    }
    for (int i = 0; i < n_frames; i++) {
        int more = i + 1 < n_frames ? ZMQ_SNDMORE : 0;
        if (zmq_send(socket, frames[i].data, frames[i].size_bytes, more | dw) < 0) {
            int e = zmq_errno();
            rc = error_set(err, send_errno_code(e), "zmq_send(frame %d): %s", i + 1,
                           zmq_strerror(e));
            goto done;
        }
    }
done:
    cJSON_free(text);
    return rc;
}

void protocol_msg_free(struct protocol_msg *msg)
{
    if (!msg)
        return;
    cJSON_Delete(msg->header);
    for (int i = 0; i < PROTOCOL_MAX_FRAMES; i++)
        free(msg->frame_data[i]);
    memset(msg, 0, sizeof *msg);
}

/* Validates a parsed header; ERR_PROTOCOL with the reason. */
static int check_header(struct protocol_msg *msg, char *err)
{
    const cJSON *h = msg->header;
    if (!cJSON_IsObject(h))
        return error_set(err, ERR_PROTOCOL, "header: expected a JSON object");
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(h, "v");
    if (!v)
        return error_set(err, ERR_PROTOCOL, "v: required");
    if (!cJSON_IsNumber(v) || v->valuedouble != (double)PROTOCOL_VERSION) {
        if (cJSON_IsNumber(v))
            return error_set(err, ERR_PROTOCOL, "v: unsupported protocol version %g (expected %d)",
                             v->valuedouble, PROTOCOL_VERSION);
        return error_set(err, ERR_PROTOCOL, "v: expected the integer %d", PROTOCOL_VERSION);
    }
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(h, "type");
    if (!t)
        return error_set(err, ERR_PROTOCOL, "type: required");
    if (!cJSON_IsString(t) || t->valuestring[0] == '\0')
        return error_set(err, ERR_PROTOCOL, "type: expected a non-empty string");
    msg->type = t->valuestring;
    return 0;
}

int protocol_msg_parse_header(struct protocol_msg *msg, const void *data, size_t size, char *err)
{
    msg->header = cJSON_ParseWithLength((const char *)data, size);
    if (!msg->header)
        return error_set(err, ERR_PROTOCOL, "header: not valid JSON");
    return check_header(msg, err);
}

int protocol_msg_adopt_header(struct protocol_msg *msg, cJSON *header, char *err)
{
    msg->header = header;
    if (!header)
        return error_set(err, ERR_NOMEM, "header: out of memory");
    return check_header(msg, err);
}

int protocol_recv(void *socket, bool with_identity, size_t max_message_bytes, int flags,
                  struct protocol_msg *msg, char *err)
{
    memset(msg, 0, sizeof *msg);
    if (!socket)
        return error_set(err, ERR_INVALID_ARG, "protocol_recv: no socket");
    zmq_msg_t part;
    if (zmq_msg_init(&part) != 0)
        return error_set(err, ERR_SYSTEM, "zmq_msg_init: %s", zmq_strerror(zmq_errno()));
    if (zmq_msg_recv(&part, socket, (flags & PROTOCOL_DONTWAIT) ? ZMQ_DONTWAIT : 0) < 0) {
        int e = zmq_errno();
        zmq_msg_close(&part);
        if (e == EAGAIN)
            return error_set(err, ERR_TIMEOUT, "zmq_msg_recv: nothing to receive");
        if (e == EINTR)
            return error_set(err, ERR_CANCELLED, "zmq_msg_recv: interrupted");
        return error_set(err, ERR_SYSTEM, "zmq_msg_recv: %s", zmq_strerror(e));
    }
    int rc = 0; /* first failure; later parts are still drained */
    int index = 0;
    bool have_header = false;
    for (;;) {
        int more = zmq_msg_more(&part);
        size_t size = zmq_msg_size(&part);
        const void *data = zmq_msg_data(&part);
        if (with_identity && index == 0) {
            if (size == 0 || size > PROTOCOL_IDENTITY_MAX) {
                if (rc == 0)
                    rc = error_set(err, ERR_PROTOCOL, "routing id: bad size %zu", size);
            } else {
                memcpy(msg->identity, data, size);
                msg->identity_size = size;
            }
        } else {
            msg->total_bytes += size;
            if (rc != 0) {
                /* draining */
            } else if (msg->total_bytes > max_message_bytes) {
                rc = error_set(err, ERR_PROTOCOL, "message: larger than the limit of %zu bytes",
                               max_message_bytes);
            } else if (!have_header) {
                have_header = true;
                rc = protocol_msg_parse_header(msg, data, size, err);
            } else if (msg->n_frames >= PROTOCOL_MAX_FRAMES) {
                rc = error_set(err, ERR_PROTOCOL, "message: more than %d binary frames",
                               PROTOCOL_MAX_FRAMES);
            } else {
                void *copy = malloc(size > 0 ? size : 1);
                if (!copy) {
                    rc = error_set(err, ERR_NOMEM, "message: out of memory for a %zu-byte frame",
                                   size);
                } else {
                    memcpy(copy, data, size);
                    msg->frame_data[msg->n_frames] = copy;
                    msg->frame_size_bytes[msg->n_frames] = size;
                    msg->n_frames++;
                }
            }
        }
        zmq_msg_close(&part);
        index++;
        if (!more)
            break;
        if (zmq_msg_init(&part) != 0)
            return error_set(err, ERR_SYSTEM, "zmq_msg_init: %s", zmq_strerror(zmq_errno()));
        if (zmq_msg_recv(&part, socket, 0) < 0) {
            int e = zmq_errno();
            zmq_msg_close(&part);
            return error_set(err, ERR_SYSTEM, "zmq_msg_recv (part %d): %s", index,
                             zmq_strerror(e));
        }
    }
    if (rc == 0 && !have_header)
        rc = error_set(err, ERR_PROTOCOL, "message: no header frame");
    return rc;
}

int protocol_frame_tokens(const struct protocol_msg *msg, int index, const char *name,
                          int min_count, int max_count, const int32_t **tokens, int *n_tokens,
                          char *err)
{
    if (index < 0 || index >= msg->n_frames)
        return error_set(err, ERR_PROTOCOL, "%s: token frame %d missing (%d binary frames)", name,
                         index + 1, msg->n_frames);
    size_t size = msg->frame_size_bytes[index];
    if (size % sizeof(int32_t) != 0)
        return error_set(err, ERR_PROTOCOL, "%s: frame of %zu bytes is not an int32 array", name,
                         size);
    size_t n = size / sizeof(int32_t);
    if (n < (size_t)(min_count < 0 ? 0 : min_count) || n > (size_t)(max_count < 0 ? 0 : max_count))
        return error_set(err, ERR_PROTOCOL, "%s: %zu tokens, expected %d..%d", name, n, min_count,
                         max_count);
    *tokens = (const int32_t *)msg->frame_data[index];
    *n_tokens = (int)n;
    return 0;
}

/* ---- field getters ---- */

static const cJSON *lookup(const cJSON *obj, const char *field)
{
    if (!cJSON_IsObject(obj))
        return NULL;
    const char *dot = strrchr(field, '.');
    return cJSON_GetObjectItemCaseSensitive(obj, dot ? dot + 1 : field);
}

#define JSON_EXACT_INT_MAX 9007199254740992.0 /* 2^53 */

/* item as an integer a JSON number holds exactly (|v| <= 2^53). */
static int get_integer(const cJSON *item, const char *field, int64_t *out, char *err)
{
    if (!cJSON_IsNumber(item))
        return error_set(err, ERR_PROTOCOL, "%s: expected an integer, got %s", field,
                         json_type_name(item));
    double v = item->valuedouble;
    if (!isfinite(v) || v != floor(v) || fabs(v) > JSON_EXACT_INT_MAX)
        return error_set(err, ERR_PROTOCOL, "%s: expected an integer, got %g", field, v);
    *out = (int64_t)v;
    return 0;
}

/* v in lo..hi; a hi at the type's largest value (type_max) is no bound
 * worth naming in the message. */
static int check_range(const char *field, int64_t v, int64_t lo, int64_t hi, int64_t type_max,
                       char *err)
{
    if (v >= lo && v <= hi)
        return 0;
    if (hi >= type_max)
        return error_set(err, ERR_PROTOCOL, "%s: must be >= %lld, got %lld", field,
                         (long long)lo, (long long)v);
    return error_set(err, ERR_PROTOCOL, "%s: must be in %lld..%lld, got %lld", field,
                     (long long)lo, (long long)hi, (long long)v);
}

int protocol_get_int(const cJSON *obj, const char *field, int lo, int hi, int *out, char *err)
{
    const cJSON *item = lookup(obj, field);
    if (!item)
        return error_set(err, ERR_PROTOCOL, "%s: required", field);
    int64_t v = 0;
    int rc = get_integer(item, field, &v, err);
    if (rc == 0)
        rc = check_range(field, v, lo, hi, INT_MAX, err);
    if (rc == 0)
        *out = (int)v;
    return rc;
}

int protocol_get_int_opt(const cJSON *obj, const char *field, int lo, int hi, int dflt, int *out,
                         char *err)
{
    if (!lookup(obj, field)) {
        *out = dflt;
        return 0;
    }
    return protocol_get_int(obj, field, lo, hi, out, err);
}

int protocol_get_i64(const cJSON *obj, const char *field, int64_t lo, int64_t hi, int64_t *out,
                     char *err)
{
    const cJSON *item = lookup(obj, field);
    if (!item)
        return error_set(err, ERR_PROTOCOL, "%s: required", field);
    int64_t v = 0;
    int rc = get_integer(item, field, &v, err);
    if (rc == 0)
        rc = check_range(field, v, lo, hi, (int64_t)JSON_EXACT_INT_MAX, err);
    if (rc == 0)
        *out = v;
    return rc;
}

int protocol_get_i64_opt(const cJSON *obj, const char *field, int64_t lo, int64_t hi,
                         int64_t dflt, int64_t *out, char *err)
{
    if (!lookup(obj, field)) {
        *out = dflt;
        return 0;
    }
    return protocol_get_i64(obj, field, lo, hi, out, err);
}

int protocol_get_double(const cJSON *obj, const char *field, double lo, double hi, double *out,
                        char *err)
{
    const cJSON *item = lookup(obj, field);
    if (!item)
        return error_set(err, ERR_PROTOCOL, "%s: required", field);
    if (!cJSON_IsNumber(item))
        return error_set(err, ERR_PROTOCOL, "%s: expected a number, got %s", field,
                         json_type_name(item));
    double v = item->valuedouble;
    if (!isfinite(v) || v < lo || v > hi) {
        if (hi >= DBL_MAX)
            return error_set(err, ERR_PROTOCOL, "%s: must be >= %g, got %g", field, lo, v);
        return error_set(err, ERR_PROTOCOL, "%s: must be in %g..%g, got %g", field, lo, hi, v);
    }
    *out = v;
    return 0;
}

int protocol_get_double_opt(const cJSON *obj, const char *field, double lo, double hi,
                            double dflt, double *out, char *err)
{
    if (!lookup(obj, field)) {
        *out = dflt;
        return 0;
    }
    return protocol_get_double(obj, field, lo, hi, out, err);
}

int protocol_get_bool(const cJSON *obj, const char *field, bool *out, char *err)
{
    const cJSON *item = lookup(obj, field);
    if (!item)
        return error_set(err, ERR_PROTOCOL, "%s: required", field);
    if (!cJSON_IsBool(item))
        return error_set(err, ERR_PROTOCOL, "%s: expected a boolean, got %s", field,
                         json_type_name(item));
    *out = cJSON_IsTrue(item);
    return 0;
}

int protocol_get_bool_opt(const cJSON *obj, const char *field, bool dflt, bool *out, char *err)
{
    if (!lookup(obj, field)) {
        *out = dflt;
        return 0;
    }
    return protocol_get_bool(obj, field, out, err);
}

int protocol_get_string(const cJSON *obj, const char *field, size_t max_len, const char **out,
                        char *err)
{
    const cJSON *item = lookup(obj, field);
    if (!item)
        return error_set(err, ERR_PROTOCOL, "%s: required", field);
    if (!cJSON_IsString(item))
        return error_set(err, ERR_PROTOCOL, "%s: expected a string, got %s", field,
                         json_type_name(item));
    if (strlen(item->valuestring) > max_len)
        return error_set(err, ERR_PROTOCOL, "%s: longer than %zu bytes", field, max_len);
    *out = item->valuestring;
    return 0;
}

int protocol_get_string_opt(const cJSON *obj, const char *field, size_t max_len,
                            const char *dflt, const char **out, char *err)
{
    if (!lookup(obj, field)) {
        *out = dflt;
        return 0;
    }
    return protocol_get_string(obj, field, max_len, out, err);
}

int protocol_get_object(const cJSON *obj, const char *field, const cJSON **out, char *err)
{
    const cJSON *item = lookup(obj, field);
    if (!item)
        return error_set(err, ERR_PROTOCOL, "%s: required", field);
    if (!cJSON_IsObject(item))
        return error_set(err, ERR_PROTOCOL, "%s: expected an object, got %s", field,
                         json_type_name(item));
    *out = item;
    return 0;
}

int protocol_get_object_opt(const cJSON *obj, const char *field, const cJSON **out, char *err)
{
    if (!lookup(obj, field)) {
        *out = NULL;
        return 0;
    }
    return protocol_get_object(obj, field, out, err);
}

int protocol_get_int_array(const cJSON *obj, const char *field, int lo, int hi, int32_t *out,
                           int max_count, int *n_out, char *err)
{
    const cJSON *item = lookup(obj, field);
    if (!item)
        return error_set(err, ERR_PROTOCOL, "%s: required", field);
    if (!cJSON_IsArray(item))
        return error_set(err, ERR_PROTOCOL, "%s: expected an array, got %s", field,
                         json_type_name(item));
    int n = cJSON_GetArraySize(item);
    if (n > max_count)
        return error_set(err, ERR_PROTOCOL, "%s: more than %d elements", field, max_count);
    int i = 0;
    for (const cJSON *el = item->child; el; el = el->next, i++) {
        char name[160];
        snprintf(name, sizeof name, "%s[%d]", field, i);
        int64_t v = 0;
        int rc = get_integer(el, name, &v, err);
        if (rc == 0)
            rc = check_range(name, v, lo, hi, INT_MAX, err);
        if (rc != 0)
            return rc;
        out[i] = (int32_t)v;
    }
    *n_out = n;
    return 0;
}

int protocol_check_fields(const cJSON *obj, const char *const *allowed, const char *prefix,
                          char *err)
{
    if (!cJSON_IsObject(obj))
        return error_set(err, ERR_PROTOCOL, "%s: expected an object", prefix ? prefix : "message");
    for (const cJSON *item = obj->child; item; item = item->next) {
        const char *key = item->string ? item->string : "";
        bool known = false;
        for (int i = 0; allowed[i]; i++)
            if (strcmp(allowed[i], key) == 0) {
                known = true;
                break;
            }
        if (!known) {
            if (prefix)
                return error_set(err, ERR_PROTOCOL, "%s.%.100s: unknown field", prefix, key);
            return error_set(err, ERR_PROTOCOL, "%.100s: unknown field", key);
        }
    }
    return 0;
}

int protocol_dealer_connect(void *zctx, const char *endpoint, const char *curve_server_public,
                            const char *curve_secret, void **out_socket, char *err)
{
    *out_socket = NULL;
    void *s = zmq_socket(zctx, ZMQ_DEALER);
    if (!s)
        return error_set(err, ERR_SYSTEM, "zmq_socket(DEALER): %s", zmq_strerror(zmq_errno()));
    int linger = 0, immediate = 1, ivl = 100, ivl_max = 250;
    if (zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof linger) != 0 ||
        zmq_setsockopt(s, ZMQ_IMMEDIATE, &immediate, sizeof immediate) != 0 ||
        zmq_setsockopt(s, ZMQ_RECONNECT_IVL, &ivl, sizeof ivl) != 0 ||
        zmq_setsockopt(s, ZMQ_RECONNECT_IVL_MAX, &ivl_max, sizeof ivl_max) != 0) {
        int e = zmq_errno();
        zmq_close(s);
        return error_set(err, ERR_SYSTEM, "zmq_setsockopt(DEALER): %s", zmq_strerror(e));
    }
    int rc = curve_server_public ? curve_client_setup(s, curve_server_public, curve_secret, err) : 0;
    if (rc) {
        zmq_close(s);
        return rc;
    }
    if (zmq_connect(s, endpoint) != 0) {
        int e = zmq_errno();
        zmq_close(s);
        return error_set(err, ERR_SYSTEM, "zmq_connect(%s): %s", endpoint, zmq_strerror(e));
    }
    *out_socket = s;
    return 0;
}

double protocol_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1000.0 + (double)ts.tv_nsec / 1.0e6;
}
