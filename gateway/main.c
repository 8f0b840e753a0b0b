/* main.c: tandem-gateway, the OpenAI-compatible HTTP front of a Tandem
 * instance. Thin: parse the config, connect to the coordinator, serve HTTP
 * until SIGTERM/SIGINT, stop.
 *
 *   tandem-gateway [--config FILE] [--KEY VALUE]...
 *
 * Keys are those of the "gateway" section (common/wire/proc_config.h), plus
 * "instance" and qualified keys of other sections. Exit status 78 on a
 * configuration error or a listen address it cannot serve (in use; the
 * supervisor does not restart it), 1 on another failure to start.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "bridge.h"
#include "curve_keys.h"
#include "error.h"
#include "http_metrics.h"
#include "logging.h"
#include "proc_start.h"
#include "server.h"

/* HTTP opens once the coordinator's handshake is done, or after this: a
 * request in between would be answered 503 (started beside the coordinator,
 * or restarted, the gateway is usually connected within milliseconds). */
#define GATEWAY_CONNECT_WAIT_MS 5000

/* Descriptors beside the HTTP connections: the listening socket, the event
 * loops' epoll and wake-up descriptors, ZeroMQ's sockets and threads. */
#define GATEWAY_SPARE_FDS 128

/* Raises the soft limit on open files to what max_connections needs (as far
 * as the hard limit allows): a service's soft limit is often 1024, and each
 * HTTP connection is a descriptor. Past the limit new connections are
 * refused; that is logged, and the gateway serves what it can. */
static void fit_open_files(const struct gateway_config *g)
{
    struct rlimit rl;
    const rlim_t need = (rlim_t)server_socket_limit(g) + GATEWAY_SPARE_FDS;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0) {
        LOG_WARN("getrlimit(RLIMIT_NOFILE): %s", strerror(errno));
        return;
    }
    if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < need) {
        rlim_t want = rl.rlim_max == RLIM_INFINITY || rl.rlim_max >= need ? need : rl.rlim_max;
        struct rlimit raised = {.rlim_cur = want, .rlim_max = rl.rlim_max};
        if (setrlimit(RLIMIT_NOFILE, &raised) != 0)
            LOG_WARN("setrlimit(RLIMIT_NOFILE, %llu): %s", (unsigned long long)want, strerror(errno));
        else
            rl.rlim_cur = want;
    }
    if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < need)
        LOG_WARN("open files are limited to %llu: fewer than gateway.max_connections (%d) connections can be "
                 "served; raise the limit (systemd: LimitNOFILE) or lower gateway.max_connections",
                 (unsigned long long)rl.rlim_cur, g->max_connections);
}

int main(int argc, char **argv)
{
    struct proc_config cfg;
    int start = proc_start(argc, argv, "gateway", PROC_CONFIG_GATEWAY, &cfg);
    if (start != PROC_START_GO)
        return start;
    char err[ERR_MSG_MAX] = "";
    const char *api_key = cfg.gateway.api_key;
    if (api_key[0] == '\0' && cfg.gateway.api_key_env[0] != '\0') {
        api_key = getenv(cfg.gateway.api_key_env);
        if (api_key == NULL || api_key[0] == '\0') {
            fprintf(stderr, "tandem-gateway: gateway.api_key_env: %s is not set or empty\n", cfg.gateway.api_key_env);
            return PROC_START_EXIT_CONFIG;
        }
    }

    int status = 1;
    struct bridge *bridge = NULL;
    struct http_metrics *metrics = NULL;
    struct server *server = NULL;
    char server_public[CURVE_KEY_Z85_SIZE], gateway_secret[CURVE_KEY_Z85_SIZE], why[ERR_MSG_MAX];
    const char *server_key = NULL, *gateway_key = NULL;
    if (cfg.gateway.coordinator_curve_public_key_file[0] != '\0') {
        if (curve_key_load(cfg.gateway.coordinator_curve_public_key_file, false, server_public, why) != 0) {
            fprintf(stderr, "tandem-gateway: gateway.coordinator_curve_public_key_file: %s\n", why);
            return PROC_START_EXIT_CONFIG;
        }
        server_key = server_public;
    }
    if (cfg.gateway.curve_secret_key_file[0] != '\0') {
        if (curve_key_load(cfg.gateway.curve_secret_key_file, true, gateway_secret, why) != 0) {
            fprintf(stderr, "tandem-gateway: gateway.curve_secret_key_file: %s\n", why);
            return PROC_START_EXIT_CONFIG;
        }
        gateway_key = gateway_secret;
    }
    struct tls_files tls;
    if (tls_files_load(&tls, &cfg.gateway, why) != 0) {
        fprintf(stderr, "tandem-gateway: %s\n", why);
        return PROC_START_EXIT_CONFIG;
    }
    fit_open_files(&cfg.gateway);
    int brc = bridge_create(&bridge, cfg.gateway.coordinator_endpoint, server_key, gateway_key,
                            (size_t)cfg.coordinator.max_message_bytes, err);
    memset(gateway_secret, 0, sizeof gateway_secret);
    if (brc != 0 || http_metrics_create(&metrics, err) != 0)
        goto done;
    if (!bridge_wait_connected(bridge, GATEWAY_CONNECT_WAIT_MS))
        LOG_WARN("not connected to the coordinator at %s (refused, or no answer within %d ms): serving HTTP "
                 "anyway, requests get 503 coordinator_unavailable until it admits this gateway",
                 cfg.gateway.coordinator_endpoint, GATEWAY_CONNECT_WAIT_MS);
    struct server_params p = {
        .cfg = &cfg.gateway,
        .api_key = api_key,
        .bridge = bridge,
        .metrics = metrics,
        .started_s = (long)time(NULL),
        .stop = &proc_start_stop_requested,
        .tls = &tls,
    };
    /* Not serving the configured address (in use, not ours) will not
     * change on a restart: a config error, so the supervisor gives up. */
    int src = server_start(&server, &p, err);
    if (src != 0) {
        status = src == ERR_NOMEM ? 1 : PROC_START_EXIT_CONFIG;
        goto done;
    }
    LOG_INFO("serving %s on %s for model \"%s\", coordinator %s%s%s%s", tls.cert_pem ? "HTTPS" : "HTTP",
             cfg.gateway.listen,
             cfg.gateway.served_model_name, cfg.gateway.coordinator_endpoint, server_key ? " (CURVE)" : "",
             api_key[0] ? ", API key required" : "", cfg.gateway.metrics_require_key ? " (on /metrics too)" : "");
    if (api_key[0] == '\0' && cfg.gateway.allow_unauthenticated)
        LOG_WARN("serving %s WITHOUT an API key (gateway.allow_unauthenticated): anyone who reaches it may "
                 "generate", cfg.gateway.listen);
    while (!proc_start_stop_requested)
        pause();
    LOG_INFO("gateway stopping");
    status = 0;
done:
    if (status != 0)
        LOG_ERROR("%s", err);
    server_stop(server);
    http_metrics_destroy(metrics);
    bridge_destroy(bridge);
    tls_files_free(&tls);
    return status;
}
