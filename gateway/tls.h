/* tls.h: the gateway's HTTPS material: its certificate, key and the CA of
 * client certificates, read and checked once at start (so a bad or
 * unreadable file stops the gateway naming it, instead of libmicrohttpd
 * failing without saying which), and the check of a client's certificate.
 * libmicrohttpd serves TLS itself, with GnuTLS; this module only feeds it.
 */
#ifndef TANDEM_GATEWAY_TLS_H
#define TANDEM_GATEWAY_TLS_H

#include <stdbool.h>
#include <stddef.h>

#include <microhttpd.h>

#include "proc_config.h"

/* PEM texts, NUL-terminated; NULL = not configured. */
struct tls_files {
    char *cert_pem;
    char *key_pem;
    char *client_ca_pem;
};

/* Reads and checks cfg's tls_* files: each parses, and the key is the
 * certificate's. All NULL (and 0) when tls_cert_file is "". On failure,
 * err names the key, the file and what is wrong; ERR_IO (unreadable),
 * ERR_INVALID_ARG (not what it should be), ERR_NOMEM. */
int tls_files_load(struct tls_files *t, const struct gateway_config *cfg, char *err);
void tls_files_free(struct tls_files *t);   /* leaves it all NULL */

/* Whether the connection's client presented a certificate the configured
 * CA signed and that is valid now; false with why (for the client) when
 * not. Only on a connection of a daemon given client_ca_pem. */
bool tls_client_verified(struct MHD_Connection *conn, char *why, size_t why_size);

#endif
