/* curve_keys.h: ZeroMQ CURVE keys in files, and whether an endpoint can be
 * reached from other machines.
 *
 * A key file holds one Z85-encoded key (40 characters) and optional
 * surrounding whitespace; a keys file holds one key per line ('#' at the
 * start of a line or after whitespace starts a comment: '#' is also a Z85
 * character). Secret key files must not be readable by group or others:
 * the loader refuses them, as ssh does. The client side's socket options are
 * here too. What it is not: key generation (the tandem-keygen tool) or the
 * ZAP handler (the coordinator's exposure.c).
 */
#ifndef TANDEM_CURVE_KEYS_H
#define TANDEM_CURVE_KEYS_H

#include <stdbool.h>
#include <stddef.h>

#define CURVE_KEY_Z85_LEN 40
/* A Z85 key and its NUL. */
#define CURVE_KEY_Z85_SIZE (CURVE_KEY_Z85_LEN + 1)

/* Reads one key from path into out. secret: the file must be a regular file
 * not accessible by group or others. ERR_IO (unreadable), ERR_FORMAT (not one
 * 40-character Z85 key), ERR_INVALID_ARG (a secret key file with loose
 * permissions), each naming the file. */
int curve_key_load(const char *path, bool secret, char out[CURVE_KEY_Z85_SIZE], char *err);

/* Reads every key of a keys file (public keys) into keys (capacity max_keys).
 * Same errors as curve_key_load, naming the line; ERR_RANGE past max_keys. */
int curve_keys_load_list(const char *path, char (*keys)[CURVE_KEY_Z85_SIZE], int max_keys,
                         int *n_keys, char *err);

/* The public key of a Z85 secret key. ERR_FORMAT when secret is not one. */
int curve_key_public(const char *secret_z85, char out[CURVE_KEY_Z85_SIZE], char *err);

/* Makes sock (not connected yet) a CURVE client of the server whose public
 * key is server_public, with the key pair of client_secret, or a fresh pair
 * when it is NULL. Keys are Z85 strings. ERR_INVALID_ARG naming the key that
 * is not one, ERR_SYSTEM. */
int curve_client_setup(void *sock, const char *server_public, const char *client_secret, char *err);

/* true when a ZeroMQ endpoint can be reached only from this machine: ipc://,
 * inproc://, and tcp:// bound to a loopback address (127.0.0.0/8, ::1,
 * localhost). A wildcard tcp address and any other host are reachable from
 * elsewhere. */
bool curve_endpoint_is_local(const char *endpoint);

#endif
