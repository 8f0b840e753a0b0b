/* main.c: tandem-draft-worker: parse the config, run the draft worker, exit.
 *
 * Exit status: 0 after SIGTERM/SIGINT or a "shutdown" from the coordinator;
 * 78 (EX_CONFIG) for config errors, a model that does not load, and when
 * the coordinator refuses the model (the supervisor does not restart
 * those); 1 for other failures. */
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "draft_worker.h"
#include "error.h"
#include "logging.h"
#include "proc_config.h"

static volatile sig_atomic_t stop_requested;

static void on_signal(int sig)
{
    (void)sig;
    stop_requested = 1;
}

static void usage(FILE *out)
{
    fprintf(out, "usage: tandem-draft-worker --config FILE [--key value]...\n"
                 "Keys of the draft_worker section (other sections: --section.key value):\n");
    proc_config_print_usage(out, "draft_worker");
}

int main(int argc, char **argv)
{
    logging_set_tag("draft");
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            usage(stdout);
            return 0;
        }
    char err[ERR_MSG_MAX] = "";
    struct proc_config cfg;
    if (proc_config_parse_args(&cfg, argc, argv, "draft_worker", PROC_CONFIG_DRAFT, err) != 0) {
        LOG_ERROR("%s", err);
        return DRAFT_WORKER_EXIT_CONFIG;
    }
    logging_set_level((enum logging_level)logging_level_parse(cfg.draft_worker.log_level));

    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGTERM, &sa, NULL) != 0 || sigaction(SIGINT, &sa, NULL) != 0) {
        LOG_ERROR("sigaction failed");
        return 1;
    }
    signal(SIGPIPE, SIG_IGN);

    struct draft_worker *w = NULL;
    int rc = draft_worker_create(&w, &cfg, err);
    if (rc != 0) {
        LOG_ERROR("%s", err);
        /* A model that cannot load will not load on a restart either. */
        return rc == ERR_SYSTEM || rc == ERR_NOMEM ? 1 : DRAFT_WORKER_EXIT_CONFIG;
    }
    rc = draft_worker_run(w, &stop_requested, err);
    draft_worker_destroy(w);
    if (rc != 0) {
        LOG_ERROR("%s", err);
        return rc == ERR_MISMATCH ? DRAFT_WORKER_EXIT_CONFIG : 1;
    }
    LOG_INFO("stopped");
    return 0;
}
