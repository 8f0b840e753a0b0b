/* main.c: tandem-gateway, the OpenAI-compatible HTTP front of a Tandem
 * instance. Thin: parse the config, connect to the coordinator, serve HTTP
 * until SIGTERM/SIGINT, stop.
 *
 *   tandem-gateway [--config FILE] [--KEY VALUE]...
 *
 * Keys are those of the "gateway" section (common/wire/proc_config.h), plus
 * "instance" and qualified keys of other sections. Exit status 78 on a
 * configuration error (the supervisor does not restart it), 1 on another
 * failure to start.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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
    int brc = bridge_create(&bridge, cfg.gateway.coordinator_endpoint, server_key, gateway_key, err);
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
    };
    if (server_start(&server, &p, err) != 0)
        goto done;
    LOG_INFO("serving HTTP on %s for model \"%s\", coordinator %s%s%s", cfg.gateway.listen,
             cfg.gateway.served_model_name, cfg.gateway.coordinator_endpoint, server_key ? " (CURVE)" : "",
             api_key[0] ? ", API key required" : "");
    while (!proc_start_stop_requested)
        pause();
    LOG_INFO("gateway stopping");
    status = 0;
done:
    if (status != 0)
        fprintf(stderr, "tandem-gateway: %s\n", err);
    server_stop(server);
    http_metrics_destroy(metrics);
    bridge_destroy(bridge);
    return status;
}
