/* curve_keys.c: CURVE key files and the locality of endpoints (see
 * curve_keys.h). */
#include "curve_keys.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <zmq.h>

#include "error.h"

/* Trims s[0..n) in place; returns the new length. */
static size_t trim(char *s, size_t n)
{
    size_t a = 0;
    while (a < n && (s[a] == ' ' || s[a] == '\t' || s[a] == '\r' || s[a] == '\n'))
        a++;
    while (n > a && (s[n - 1] == ' ' || s[n - 1] == '\t' || s[n - 1] == '\r' || s[n - 1] == '\n'))
        n--;
    memmove(s, s + a, n - a);
    s[n - a] = '\0';
    return n - a;
}

static int check_z85(const char *text, size_t len, const char *where, char *err)
{
    uint8_t raw[32];
    if (len != CURVE_KEY_Z85_LEN || zmq_z85_decode(raw, text) == NULL)
        return error_set(err, ERR_FORMAT, "%s: expected one 40-character Z85 CURVE key", where);
    return 0;
}

int curve_key_load(const char *path, bool secret, char out[CURVE_KEY_Z85_SIZE], char *err)
{
    struct stat st;
    if (stat(path, &st) != 0)
        return error_set_errno(err, ERR_IO, errno, "%s", path);
    if (!S_ISREG(st.st_mode))
        return error_set(err, ERR_IO, "%s: not a regular file", path);
    if (secret && (st.st_mode & 077))
        return error_set(err, ERR_INVALID_ARG,
                         "%s: a secret key must not be readable by group or others (mode %03o; "
                         "chmod 600 it)",
                         path, (unsigned)(st.st_mode & 0777));
    FILE *f = fopen(path, "r");
    if (!f)
        return error_set_errno(err, ERR_IO, errno, "%s", path);
    char buf[256];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    int read_error = ferror(f);
    fclose(f);
    if (read_error)
        return error_set(err, ERR_IO, "%s: read error", path);
    buf[n] = '\0';
    n = trim(buf, strlen(buf));
    int rc = check_z85(buf, n, path, err);
    if (rc)
        return rc;
    memcpy(out, buf, CURVE_KEY_Z85_SIZE);
    return 0;
}

int curve_keys_load_list(const char *path, char (*keys)[CURVE_KEY_Z85_SIZE], int max_keys,
                         int *n_keys, char *err)
{
    *n_keys = 0;
    FILE *f = fopen(path, "r");
    if (!f)
        return error_set_errno(err, ERR_IO, errno, "%s", path);
    char line[512];
    int line_no = 0, rc = 0;
    while (rc == 0 && fgets(line, sizeof line, f)) {
        line_no++;
        /* '#' is a Z85 character: a comment starts only at the beginning of
         * a line or after whitespace. */
        for (char *c = line; *c; c++)
            if (*c == '#' && (c == line || c[-1] == ' ' || c[-1] == '\t')) {
                *c = '\0';
                break;
            }
        size_t n = trim(line, strlen(line));
        if (n == 0)
            continue;
        char where[64 + 1024];
        snprintf(where, sizeof where, "%s:%d", path, line_no);
        if ((rc = check_z85(line, n, where, err)))
            break;
        if (*n_keys >= max_keys) {
            rc = error_set(err, ERR_RANGE, "%s: more than %d keys", path, max_keys);
            break;
        }
        memcpy(keys[(*n_keys)++], line, CURVE_KEY_Z85_SIZE);
    }
    if (rc == 0 && ferror(f))
        rc = error_set(err, ERR_IO, "%s: read error", path);
    fclose(f);
    return rc;
}

int curve_key_public(const char *secret_z85, char out[CURVE_KEY_Z85_SIZE], char *err)
{
    if (strlen(secret_z85) != CURVE_KEY_Z85_LEN || zmq_curve_public(out, secret_z85) != 0)
        return error_set(err, ERR_FORMAT, "not a Z85 CURVE secret key");
    return 0;
}

int curve_client_setup(void *sock, const char *server_public, const char *client_secret, char *err)
{
    char pub[CURVE_KEY_Z85_SIZE], sec[CURVE_KEY_Z85_SIZE];
    int rc = 0;
    if (server_public == NULL || strlen(server_public) != CURVE_KEY_Z85_LEN)
        rc = error_set(err, ERR_INVALID_ARG, "server public key: expected 40 Z85 characters");
    else if (client_secret == NULL && zmq_curve_keypair(pub, sec) != 0)
        rc = error_set(err, ERR_SYSTEM, "zmq_curve_keypair: %s", zmq_strerror(zmq_errno()));
    else if (client_secret != NULL &&
             (strlen(client_secret) != CURVE_KEY_Z85_LEN || zmq_curve_public(pub, client_secret) != 0))
        rc = error_set(err, ERR_INVALID_ARG, "client secret key: expected 40 Z85 characters");
    if (rc == 0 && client_secret != NULL)
        memcpy(sec, client_secret, sizeof sec);
    if (rc == 0 && (zmq_setsockopt(sock, ZMQ_CURVE_SERVERKEY, server_public, CURVE_KEY_Z85_LEN) != 0 ||
                    zmq_setsockopt(sock, ZMQ_CURVE_PUBLICKEY, pub, CURVE_KEY_Z85_LEN) != 0 ||
                    zmq_setsockopt(sock, ZMQ_CURVE_SECRETKEY, sec, CURVE_KEY_Z85_LEN) != 0))
        rc = error_set(err, ERR_SYSTEM, "CURVE options: %s", zmq_strerror(zmq_errno()));
    memset(sec, 0, sizeof sec);
    return rc;
}

bool curve_endpoint_is_local(const char *endpoint)
{
    if (strncmp(endpoint, "ipc://", 6) == 0 || strncmp(endpoint, "inproc://", 9) == 0)
        return true;
    if (strncmp(endpoint, "tcp://", 6) != 0)
        return false;
    const char *host = endpoint + 6;
    const char *colon = strrchr(host, ':');
    size_t len = colon ? (size_t)(colon - host) : strlen(host);
    /* "tcp://eth0;192.0.2.1:5555" names an interface and a source: treat
     * anything unusual as reachable. */
    if (len == 9 && strncmp(host, "localhost", 9) == 0)
        return true;
    if ((len == 5 && strncmp(host, "[::1]", 5) == 0) || (len == 3 && strncmp(host, "::1", 3) == 0))
        return true;
    if (len >= 4 && strncmp(host, "127.", 4) == 0) {
        for (size_t i = 4; i < len; i++)
            if (!((host[i] >= '0' && host[i] <= '9') || host[i] == '.'))
                return false;
        return true;
    }
    return false;
}
