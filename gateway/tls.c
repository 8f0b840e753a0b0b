/* tls.c: HTTPS material read and checked at start; client certificates
 * checked per request (see tls.h). GnuTLS is the library libmicrohttpd
 * serves TLS with, so what passes here is what it will load. */
#include "tls.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <gnutls/gnutls.h>
#include <gnutls/x509.h>

#include "error.h"

/* A certificate chain or a key is a few KiB; a file far larger is not one. */
#define TLS_FILE_MAX_BYTES (1 << 20)

static int read_pem(const char *key, const char *path, char **out, char *err)
{
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return error_set(err, ERR_IO, "gateway.%s: cannot read %s: %s", key, path, strerror(errno));
    char *buf = malloc(TLS_FILE_MAX_BYTES + 1);
    if (buf == NULL) {
        fclose(f);
        return error_set(err, ERR_NOMEM, "gateway.%s: out of memory", key);
    }
    size_t n = fread(buf, 1, TLS_FILE_MAX_BYTES + 1, f);
    int failed = ferror(f);
    fclose(f);
    if (failed || n == 0 || n > TLS_FILE_MAX_BYTES) {
        free(buf);
        return error_set(err, failed ? ERR_IO : ERR_INVALID_ARG, "gateway.%s: %s: %s", key, path,
                         failed ? "read error" : n == 0 ? "empty" : "larger than 1 MiB: not a PEM file");
    }
    buf[n] = '\0';
    *out = buf;
    return 0;
}

/* The number of PEM certificates in pem, or a negative GnuTLS code. */
static int count_certs(const char *pem)
{
    gnutls_datum_t d = {(unsigned char *)pem, (unsigned)strlen(pem)};
    gnutls_x509_crt_t *certs = NULL;
    unsigned n = 0;
    int rc = gnutls_x509_crt_list_import2(&certs, &n, &d, GNUTLS_X509_FMT_PEM, 0);
    if (rc < 0)
        return rc;
    for (unsigned i = 0; i < n; i++)
        gnutls_x509_crt_deinit(certs[i]);
    gnutls_free(certs);
    return (int)n;
}

static int check_key(const char *pem)
{
    gnutls_datum_t d = {(unsigned char *)pem, (unsigned)strlen(pem)};
    gnutls_x509_privkey_t k;
    int rc = gnutls_x509_privkey_init(&k);
    if (rc < 0)
        return rc;
    rc = gnutls_x509_privkey_import2(k, &d, GNUTLS_X509_FMT_PEM, NULL, 0);
    gnutls_x509_privkey_deinit(k);
    return rc;
}

/* Whether the key is the certificate's: GnuTLS checks that when it loads the pair. */
static int check_pair(const char *cert_pem, const char *key_pem)
{
    gnutls_certificate_credentials_t cred;
    int rc = gnutls_certificate_allocate_credentials(&cred);
    if (rc < 0)
        return rc;
    gnutls_datum_t c = {(unsigned char *)cert_pem, (unsigned)strlen(cert_pem)};
    gnutls_datum_t k = {(unsigned char *)key_pem, (unsigned)strlen(key_pem)};
    rc = gnutls_certificate_set_x509_key_mem(cred, &c, &k, GNUTLS_X509_FMT_PEM);
    gnutls_certificate_free_credentials(cred);
    return rc;
}

int tls_files_load(struct tls_files *t, const struct gateway_config *cfg, char *err)
{
    memset(t, 0, sizeof(*t));
    if (cfg->tls_cert_file[0] == '\0')
        return 0;
    int rc = read_pem("tls_cert_file", cfg->tls_cert_file, &t->cert_pem, err);
    if (rc == 0)
        rc = read_pem("tls_key_file", cfg->tls_key_file, &t->key_pem, err);
    if (rc == 0 && cfg->tls_client_ca_file[0] != '\0')
        rc = read_pem("tls_client_ca_file", cfg->tls_client_ca_file, &t->client_ca_pem, err);
    if (rc != 0)
        goto fail;
    int g = count_certs(t->cert_pem);
    if (g <= 0) {
        rc = error_set(err, ERR_INVALID_ARG, "gateway.tls_cert_file: %s: not a PEM certificate (%s)",
                       cfg->tls_cert_file, g < 0 ? gnutls_strerror(g) : "none in it");
        goto fail;
    }
    if ((g = check_key(t->key_pem)) < 0) {
        rc = error_set(err, ERR_INVALID_ARG, "gateway.tls_key_file: %s: not an unencrypted PEM private key (%s)",
                       cfg->tls_key_file, gnutls_strerror(g));
        goto fail;
    }
    if ((g = check_pair(t->cert_pem, t->key_pem)) < 0) {
        rc = error_set(err, ERR_INVALID_ARG,
                       "gateway.tls_key_file: %s is not the key of gateway.tls_cert_file %s (%s)", cfg->tls_key_file,
                       cfg->tls_cert_file, gnutls_strerror(g));
        goto fail;
    }
    if (t->client_ca_pem != NULL && (g = count_certs(t->client_ca_pem)) <= 0) {
        rc = error_set(err, ERR_INVALID_ARG, "gateway.tls_client_ca_file: %s: not a PEM certificate (%s)",
                       cfg->tls_client_ca_file, g < 0 ? gnutls_strerror(g) : "none in it");
        goto fail;
    }
    return 0;
fail:
    tls_files_free(t);
    return rc;
}

void tls_files_free(struct tls_files *t)
{
    if (t->key_pem != NULL) /* the key's bytes do not outlive their use */
        memset(t->key_pem, 0, strlen(t->key_pem));
    free(t->cert_pem);
    free(t->key_pem);
    free(t->client_ca_pem);
    memset(t, 0, sizeof(*t));
}

bool tls_client_verified(struct MHD_Connection *conn, char *why, size_t why_size)
{
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_GNUTLS_SESSION);
    if (ci == NULL || ci->tls_session == NULL) {
        snprintf(why, why_size, "no TLS session");
        return false;
    }
    unsigned status = 0;
    int rc = gnutls_certificate_verify_peers2((gnutls_session_t)ci->tls_session, &status);
    if (rc == GNUTLS_E_NO_CERTIFICATE_FOUND) {
        snprintf(why, why_size, "a client certificate is required (gateway.tls_client_ca_file)");
        return false;
    }
    if (rc < 0) {
        snprintf(why, why_size, "the client certificate could not be checked: %s", gnutls_strerror(rc));
        return false;
    }
    if (status != 0) {
        gnutls_datum_t out = {NULL, 0};
        if (gnutls_certificate_verification_status_print(status, GNUTLS_CRT_X509, &out, 0) == 0) {
            snprintf(why, why_size, "the client certificate was refused: %s", (const char *)out.data);
            gnutls_free(out.data);
        } else {
            snprintf(why, why_size, "the client certificate was refused (status 0x%x)", status);
        }
        return false;
    }
    return true;
}
