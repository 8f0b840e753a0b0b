/* proc_start.h: how the coordinator and the gateway start (the workers
 * start in worker/worker_main.c, which also prepares the run dir and logs
 * its errors): --help prints the usage and the keys of the process's
 * section; the config (a file, then --KEY VALUE flags) is parsed and
 * finalized; the log level is the section's; SIGTERM and SIGINT set the
 * stop flag, SIGPIPE is ignored.
 */
#ifndef TANDEM_PROC_START_H
#define TANDEM_PROC_START_H

#include <signal.h>

#include "proc_config.h"

/* EX_CONFIG: the supervisor does not restart a process that exits with it. */
#define PROC_START_EXIT_CONFIG 78
/* proc_start's answer when main goes on. */
#define PROC_START_GO (-1)

/* Most command-line arguments a process takes. */
#define PROC_START_ARGS_MAX 256

/* name: "coordinator" or "gateway" (the section, the log tag, and
 * "tandem-<name>" in messages); sections: what to finalize (PROC_CONFIG_*).
 * Returns PROC_START_GO with *cfg filled and the handlers installed, or the
 * status main returns now: 0 after --help, or after --check-config with a
 * config that parses and finalizes (every key of every section of the file
 * is checked; nothing is started), PROC_START_EXIT_CONFIG after a config
 * error (said on stderr), 1 when a handler cannot be installed. */
int proc_start(int argc, char **argv, const char *name, unsigned sections, struct proc_config *cfg);

/* Set (to 1) by SIGTERM and SIGINT once proc_start installed the handlers:
 * the one process-wide variable, written only by the handler. */
extern volatile sig_atomic_t proc_start_stop_requested;

#endif
