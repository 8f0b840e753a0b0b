/* main.c: tandem-coordinator. Thin: parse the config, create, run, destroy.
 *
 *   tandem-coordinator [--config FILE] [--KEY VALUE]...
 *
 * Keys are those of the "coordinator" section (common/wire/proc_config.h), plus
 * "instance" and qualified keys of other sections. Exits 78 (EX_CONFIG) on a
 * config error, an unusable key or tokenizer file or an endpoint it cannot
 * bind (in use), before doing any work; 1 on a system failure. SIGTERM/SIGINT stop it cleanly (the
 * supervisor stops the workers; the coordinator does not).
 */
#include <signal.h>
#include <string.h>

#include "coordinator.h"
#include "error.h"
#include "logging.h"
#include "proc_start.h"

int main(int argc, char **argv)
{
    struct proc_config cfg;
    int status = proc_start(argc, argv, "coordinator", PROC_CONFIG_COORDINATOR, &cfg);
    if (status != PROC_START_GO)
        return status;

    char err[ERR_MSG_MAX] = "";
    struct coordinator *c = NULL;
    int crc = coordinator_create(&c, &cfg, err);
    if (crc != 0) {
        LOG_ERROR("%s", err);
        /* A configuration problem (a bad key file, tokenizer or run_dir) will
         * not go away on a restart. */
        return crc == ERR_SYSTEM || crc == ERR_NOMEM ? 1 : PROC_START_EXIT_CONFIG;
    }
    int rc = coordinator_run(c, &proc_start_stop_requested, err);
    if (rc != 0)
        LOG_ERROR("%s", err);
    coordinator_destroy(c);
    /* coordinator.metrics_listen not served (in use, not ours): as above */
    return rc == 0 ? 0 : rc == ERR_INVALID_ARG ? PROC_START_EXIT_CONFIG : 1;
}
