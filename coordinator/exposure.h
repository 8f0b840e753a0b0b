/* exposure.h: who may talk to the coordinator's client endpoint, and to
 * its worker endpoint (coordinator.worker_curve_keys_file: workers on other
 * hosts, docs/scale-out.md).
 *
 * With coordinator.curve_secret_key_file the client socket is a ZeroMQ CURVE
 * server: traffic is encrypted and a client must know the server's public
 * key. With coordinator.curve_client_keys_file as well, a ZAP handler admits
 * only the listed client public keys (others are refused during the
 * handshake and never reach the request path). Without CURVE the endpoint
 * must be local (proc_config refuses otherwise) or coordinator.insecure set,
 * which is logged as a warning at every start.
 *
 * Single-threaded like the rest of the coordinator: the ZAP requests are
 * served from the poll loop (exposure_zap_socket, exposure_on_zap).
 */
#ifndef TANDEM_EXPOSURE_H
#define TANDEM_EXPOSURE_H

#include "proc_config.h"

struct exposure;

/* Loads the keys the config names and, with a client keys file, binds the
 * ZAP handler in zctx (before any CURVE socket binds, so no handshake can
 * miss it). Logs how the client endpoint is exposed. ERR_IO / ERR_FORMAT /
 * ERR_INVALID_ARG from the key files (naming the key and the file),
 * ERR_SYSTEM naming the zmq call. */
int exposure_create(struct exposure **out, void *zctx, const struct coordinator_config *cc,
                    char *err);

/* Makes client_socket a CURVE server when configured; call before zmq_bind.
 * ERR_SYSTEM naming the option. */
int exposure_apply(struct exposure *e, void *client_socket, char *err);

/* Makes the worker socket a CURVE server admitting only the keys of
 * coordinator.worker_curve_keys_file, when that is set; call before
 * zmq_bind. ERR_SYSTEM naming the option. */
int exposure_apply_workers(struct exposure *e, void *worker_socket, char *err);

/* The ZAP socket to poll for input, or NULL when there is none. */
void *exposure_zap_socket(const struct exposure *e);

/* Answers one pending ZAP request (admit a listed key, refuse others). */
void exposure_on_zap(struct exposure *e);

/* Closes the ZAP socket; NULL-safe. */
void exposure_destroy(struct exposure *e);

#endif
