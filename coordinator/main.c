/* main.c: tandem-coordinator. Thin: parse the config, create, run, destroy.
 *
 *   tandem-coordinator [--config FILE] [--KEY VALUE]...
 *
 * Keys are those of the "coordinator" section (common/wire/proc_config.h), plus
 * "instance" and qualified keys of other sections. Exits 78 (EX_CONFIG) on a
 * config error or an unusable key or tokenizer file, before doing any work;
 * 1 when a socket cannot be bound. SIGTERM/SIGINT stop it cleanly (the
 * supervisor stops the workers; the coordinator does not).
 */
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "coordinator.h"
#include "error.h"
#include "logging.h"
#include "proc_config.h"

/* The only process-wide state: set by the signal handler, read by the loop. */
static volatile sig_atomic_t stop_requested;

/* EX_CONFIG, as the workers: the supervisor does not restart a process that
 * exits with it. */
#define COORDINATOR_EXIT_CONFIG 78

static void on_signal(int signo)
{
    (void)signo;
    stop_requested = 1;
}

int main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            printf("usage: tandem-coordinator [--config FILE] [--KEY VALUE]...\n");
            proc_config_print_usage(stdout, "coordinator");
            return 0;
        }
    }
    logging_set_tag("coordinator");
    char err[ERR_MSG_MAX] = "";
    struct proc_config cfg;
    if (proc_config_parse_args(&cfg, argc, argv, "coordinator", PROC_CONFIG_COORDINATOR, err) != 0) {
        fprintf(stderr, "tandem-coordinator: %s\n", err);
        return COORDINATOR_EXIT_CONFIG;
    }
    int level = logging_level_parse(cfg.coordinator.log_level);
    if (level >= 0)
        logging_set_level((enum logging_level)level);

    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGTERM, &sa, NULL) != 0 || sigaction(SIGINT, &sa, NULL) != 0) {
        perror("tandem-coordinator: sigaction");
        return 1;
    }
    signal(SIGPIPE, SIG_IGN);

    struct coordinator *c = NULL;
    int crc = coordinator_create(&c, &cfg, err);
    if (crc != 0) {
        fprintf(stderr, "tandem-coordinator: %s\n", err);
        /* A configuration problem (a bad key file, tokenizer or run_dir) will
         * not go away on a restart. */
        return crc == ERR_SYSTEM || crc == ERR_NOMEM ? 1 : COORDINATOR_EXIT_CONFIG;
    }
    int rc = coordinator_run(c, &stop_requested, err);
    if (rc != 0)
        fprintf(stderr, "tandem-coordinator: %s\n", err);
    coordinator_destroy(c);
    return rc == 0 ? 0 : 1;
}
