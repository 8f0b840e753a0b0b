/* proc_start.c: see proc_start.h. */
#include "proc_start.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "error.h"
#include "logging.h"

volatile sig_atomic_t proc_start_stop_requested;

static void on_signal(int signo)
{
    (void)signo;
    proc_start_stop_requested = 1;
}

int proc_start(int argc, char **argv, const char *name, unsigned sections, struct proc_config *cfg)
{
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            printf("usage: tandem-%s [--config FILE] [--check-config] [--KEY VALUE]...\n", name);
            proc_config_print_usage(stdout, name);
            return 0;
        }
    }
    logging_set_tag(name);
    /* --check-config: the config read and checked as a start would, then
     * nothing started (the supervisor's restart asks before it stops the
     * running instance) */
    bool check_only = false;
    char *args[PROC_START_ARGS_MAX];
    int n_args = 0;
    for (int i = 0; i < argc; i++) {
        if (i > 0 && strcmp(argv[i], "--check-config") == 0) {
            check_only = true;
            continue;
        }
        if (n_args == PROC_START_ARGS_MAX) {
            fprintf(stderr, "tandem-%s: more than %d arguments\n", name, PROC_START_ARGS_MAX - 1);
            return PROC_START_EXIT_CONFIG;
        }
        args[n_args++] = argv[i];
    }
    char err[ERR_MSG_MAX] = "";
    if (proc_config_parse_args(cfg, n_args, args, name, sections, err) != 0) {
        /* with time and level: it ends up in a log file beside other lines */
        LOG_ERROR("%s", err);
        return PROC_START_EXIT_CONFIG;
    }
    if (check_only) {
        printf("tandem-%s: configuration accepted\n", name);
        return 0;
    }
    const char *level_name = strcmp(name, "gateway") == 0 ? cfg->gateway.log_level : cfg->coordinator.log_level;
    int level = logging_level_parse(level_name);
    if (level >= 0)
        logging_set_level((enum logging_level)level);
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGTERM, &sa, NULL) != 0 || sigaction(SIGINT, &sa, NULL) != 0 ||
        logging_reopen_on_sighup() != 0) {
        fprintf(stderr, "tandem-%s: sigaction: %s\n", name, strerror(errno));
        return 1;
    }
    /* a peer that went away is a failed send to handle, not a death */
    if (signal(SIGPIPE, SIG_IGN) == SIG_ERR) {
        fprintf(stderr, "tandem-%s: signal(SIGPIPE): %s\n", name, strerror(errno));
        return 1;
    }
    return PROC_START_GO;
}
