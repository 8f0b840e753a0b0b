/* exposure.c: CURVE on the client endpoint and the ZAP handler that admits
 * listed client keys (see exposure.h). ZAP is ZeroMQ's RFC 27: a REP socket
 * bound at inproc://zeromq.zap.01 in the socket's context receives one
 * request per handshake and answers 200 (admit) or 400 (refuse).
 */
#include "exposure.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zmq.h>

#include "curve_keys.h"
#include "error.h"
#include "logging.h"

#define EXPOSURE_CLIENT_KEYS_MAX 1024
#define EXPOSURE_ZAP_FRAMES_MAX 16
/* A refused client may try again as fast as it likes (the C client and the
 * gateway connect again at each refused request, a script may loop): the
 * log names a refusal at once and then at most this often, with the count,
 * not a line per try for as long as it keeps trying. */
#define EXPOSURE_REFUSAL_LOG_EVERY_S 10.0

struct exposure {
    bool curve;
    char secret[CURVE_KEY_Z85_SIZE];
    char public_key[CURVE_KEY_Z85_SIZE];
    char worker_secret[CURVE_KEY_Z85_SIZE]; /* the worker socket's (worker_curve_secret_key_file) */
    uint8_t (*clients)[32]; /* admitted client public keys, raw */
    int n_clients;
    uint8_t (*workers)[32]; /* admitted worker public keys, raw (worker_curve_keys_file) */
    int n_workers;
    void *zap;              /* REP at inproc://zeromq.zap.01, or NULL */
    unsigned long admitted, refused;
    unsigned long refused_logged; /* refusals counted by the last log line */
    double refusal_logged_s;      /* monotonic time of that line */
};

static double monotonic_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* A keys file's public keys, raw, into *keys (malloc'd). */
static int load_keys(const char *path, const char *what, uint8_t (**keys)[32], int *n_keys, char *err)
{
    char why[ERR_MSG_MAX];
    char(*z85)[CURVE_KEY_Z85_SIZE] = calloc(EXPOSURE_CLIENT_KEYS_MAX, sizeof *z85);
    *keys = calloc(EXPOSURE_CLIENT_KEYS_MAX, sizeof **keys);
    if (!z85 || !*keys) {
        free(z85);
        return error_set(err, ERR_NOMEM, "exposure: out of memory");
    }
    int rc = curve_keys_load_list(path, z85, EXPOSURE_CLIENT_KEYS_MAX, n_keys, why);
    for (int i = 0; rc == 0 && i < *n_keys; i++)
        zmq_z85_decode((*keys)[i], z85[i]); /* validated by the loader */
    free(z85);
    return rc ? error_set(err, rc, "%s: %s", what, why) : 0;
}

int exposure_create(struct exposure **out, void *zctx, const struct coordinator_config *cc,
                    char *err)
{
    *out = NULL;
    struct exposure *e = calloc(1, sizeof *e);
    if (!e)
        return error_set(err, ERR_NOMEM, "exposure: out of memory");
    char why[ERR_MSG_MAX];
    int rc = 0;
    if (cc->curve_secret_key_file[0] != '\0') {
        if ((rc = curve_key_load(cc->curve_secret_key_file, true, e->secret, why)) ||
            (rc = curve_key_public(e->secret, e->public_key, why))) {
            rc = error_set(err, rc, "coordinator.curve_secret_key_file: %s", why);
            goto fail;
        }
        e->curve = true;
    }
    if (cc->worker_curve_secret_key_file[0] != '\0' &&
        (rc = curve_key_load(cc->worker_curve_secret_key_file, true, e->worker_secret, why))) {
        rc = error_set(err, rc, "coordinator.worker_curve_secret_key_file: %s", why);
        goto fail;
    }
    if ((cc->curve_client_keys_file[0] != '\0' &&
         (rc = load_keys(cc->curve_client_keys_file, "coordinator.curve_client_keys_file", &e->clients,
                         &e->n_clients, err))) ||
        (cc->worker_curve_keys_file[0] != '\0' &&
         (rc = load_keys(cc->worker_curve_keys_file, "coordinator.worker_curve_keys_file", &e->workers,
                         &e->n_workers, err))))
        goto fail;
    if (e->clients != NULL || e->workers != NULL) {
        e->zap = zmq_socket(zctx, ZMQ_REP);
        int linger_ms = 0;
        if (!e->zap || zmq_setsockopt(e->zap, ZMQ_LINGER, &linger_ms, sizeof linger_ms) != 0 ||
            zmq_bind(e->zap, "inproc://zeromq.zap.01") != 0) {
            rc = error_set(err, ERR_SYSTEM, "ZAP handler: zmq_socket/zmq_bind: %s",
                           zmq_strerror(zmq_errno()));
            goto fail;
        }
    }
    if (e->curve)
        LOG_INFO("client endpoint %s: CURVE, server public key %s, %s", cc->client_endpoint,
                 e->public_key,
                 e->zap ? "only the listed client keys are admitted" : "any client with that key");
    else if (cc->insecure && !curve_endpoint_is_local(cc->client_endpoint))
        LOG_WARN("client endpoint %s is reachable from other machines WITHOUT encryption or "
                 "authentication (coordinator.insecure is set)",
                 cc->client_endpoint);
    if (e->workers != NULL)
        LOG_INFO("worker endpoint %s: CURVE, only the %d listed worker keys are admitted",
                 cc->worker_endpoint, e->n_workers);
    else if (!curve_endpoint_is_local(cc->worker_endpoint))
        LOG_WARN("worker endpoint %s is reachable from other machines WITHOUT encryption or "
                 "authentication (coordinator.external_workers is set): anyone who reaches it can "
                 "register as a worker and read prompts; list the workers' keys in "
                 "coordinator.worker_curve_keys_file", cc->worker_endpoint);
    *out = e;
    return 0;
fail:
    exposure_destroy(e);
    return rc;
}

/* Domains of the two sockets' handshakes, for the ZAP handler. */
#define EXPOSURE_DOMAIN_CLIENTS "tandem"
#define EXPOSURE_DOMAIN_WORKERS "tandem-workers"

int exposure_apply_workers(struct exposure *e, void *worker_socket, char *err)
{
    if (e->workers == NULL)
        return 0;
    int server = 1;
    const char *domain = EXPOSURE_DOMAIN_WORKERS;
    if (zmq_setsockopt(worker_socket, ZMQ_CURVE_SERVER, &server, sizeof server) != 0 ||
        zmq_setsockopt(worker_socket, ZMQ_CURVE_SECRETKEY, e->worker_secret, CURVE_KEY_Z85_LEN) != 0 ||
        zmq_setsockopt(worker_socket, ZMQ_ZAP_DOMAIN, domain, strlen(domain)) != 0)
        return error_set(err, ERR_SYSTEM, "worker endpoint: CURVE options: %s", zmq_strerror(zmq_errno()));
    return 0;
}

int exposure_apply(struct exposure *e, void *client_socket, char *err)
{
    if (!e->curve)
        return 0;
    int server = 1;
    if (zmq_setsockopt(client_socket, ZMQ_CURVE_SERVER, &server, sizeof server) != 0 ||
        zmq_setsockopt(client_socket, ZMQ_CURVE_SECRETKEY, e->secret, CURVE_KEY_Z85_LEN) != 0)
        return error_set(err, ERR_SYSTEM, "client endpoint: CURVE options: %s",
                         zmq_strerror(zmq_errno()));
    if (e->zap) {
        /* A domain makes libzmq consult the handler for every handshake. */
        const char *domain = EXPOSURE_DOMAIN_CLIENTS;
        if (zmq_setsockopt(client_socket, ZMQ_ZAP_DOMAIN, domain, strlen(domain)) != 0)
            return error_set(err, ERR_SYSTEM, "client endpoint: ZMQ_ZAP_DOMAIN: %s",
                             zmq_strerror(zmq_errno()));
    }
    return 0;
}

void *exposure_zap_socket(const struct exposure *e)
{
    return e ? e->zap : NULL;
}

/* Whether key is listed for the handshake's domain (the worker socket's,
 * or the client socket's). */
static bool admitted(const struct exposure *e, const zmq_msg_t *domain, const zmq_msg_t *key)
{
    const bool workers = zmq_msg_size(domain) == strlen(EXPOSURE_DOMAIN_WORKERS) &&
                         memcmp(zmq_msg_data((zmq_msg_t *)domain), EXPOSURE_DOMAIN_WORKERS,
                                strlen(EXPOSURE_DOMAIN_WORKERS)) == 0;
    const uint8_t(*list)[32] = workers ? e->workers : e->clients;
    const int n = workers ? e->n_workers : e->n_clients;
    if (zmq_msg_size(key) != 32 || list == NULL)
        return false;
    for (int i = 0; i < n; i++)
        if (memcmp(list[i], zmq_msg_data((zmq_msg_t *)key), 32) == 0)
            return true;
    return false;
}

static int send_frame(void *sock, const void *data, size_t size, bool more)
{
    return zmq_send(sock, data, size, more ? ZMQ_SNDMORE : 0) < 0 ? -1 : 0;
}

void exposure_on_zap(struct exposure *e)
{
    zmq_msg_t frames[EXPOSURE_ZAP_FRAMES_MAX];
    int n = 0, more = 1;
    while (more) {
        zmq_msg_t part;
        zmq_msg_init(&part);
        if (zmq_msg_recv(&part, e->zap, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&part);
            if (n == 0)
                return; /* nothing pending */
            LOG_WARN("ZAP request cut short: %s", zmq_strerror(zmq_errno()));
            break;
        }
        more = zmq_msg_more(&part);
        if (n < EXPOSURE_ZAP_FRAMES_MAX)
            frames[n++] = part;
        else
            zmq_msg_close(&part);
    }
    /* version, request id, domain, address, identity, mechanism, key */
    bool ok = n >= 7 && zmq_msg_size(&frames[5]) == 5 &&
              memcmp(zmq_msg_data(&frames[5]), "CURVE", 5) == 0 && admitted(e, &frames[2], &frames[6]);
    const char *status = ok ? "200" : "400";
    const char *text = ok ? "OK" : "client key not admitted";
    if (ok)
        e->admitted++;
    else
        e->refused++;
    const double now_s = monotonic_s();
    if (!ok && (e->refused_logged == 0 || now_s - e->refusal_logged_s >= EXPOSURE_REFUSAL_LOG_EVERY_S)) {
        /* the key, so that an operator can admit it: Z85 of its 32 bytes */
        char key[CURVE_KEY_Z85_SIZE] = "(none: not a CURVE handshake)";
        if (n >= 7 && zmq_msg_size(&frames[6]) == 32 && zmq_z85_encode(key, zmq_msg_data(&frames[6]), 32) == NULL)
            snprintf(key, sizeof key, "(not encodable)");
        const bool worker = n >= 3 && zmq_msg_size(&frames[2]) == strlen(EXPOSURE_DOMAIN_WORKERS);
        LOG_WARN("refused a %s connection: its CURVE key %s is not in coordinator.%s "
                 "(%lu refused so far, %lu since the last such line)", worker ? "worker" : "client",
                 key, worker ? "worker_curve_keys_file" : "curve_client_keys_file", e->refused,
                 e->refused - e->refused_logged);
        e->refused_logged = e->refused;
        e->refusal_logged_s = now_s;
    }
    const void *req_id = n >= 2 ? zmq_msg_data(&frames[1]) : "";
    size_t req_id_size = n >= 2 ? zmq_msg_size(&frames[1]) : 0;
    if (send_frame(e->zap, "1.0", 3, true) != 0 || send_frame(e->zap, req_id, req_id_size, true) != 0 ||
        send_frame(e->zap, status, 3, true) != 0 ||
        send_frame(e->zap, text, strlen(text), true) != 0 || send_frame(e->zap, "", 0, true) != 0 ||
        send_frame(e->zap, "", 0, false) != 0)
        LOG_WARN("ZAP reply not sent: %s", zmq_strerror(zmq_errno()));
    for (int i = 0; i < n; i++)
        zmq_msg_close(&frames[i]);
}

void exposure_destroy(struct exposure *e)
{
    if (!e)
        return;
    if (e->zap && zmq_close(e->zap) != 0)
        LOG_WARN("zmq_close(ZAP): %s", zmq_strerror(zmq_errno()));
    free(e->clients);
    free(e->workers);
    memset(e->secret, 0, sizeof e->secret);
    memset(e->worker_secret, 0, sizeof e->worker_secret);
    free(e);
}
