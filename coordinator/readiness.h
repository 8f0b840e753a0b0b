/* readiness.h: which workers the coordinator holds registered, in a file of
 * the instance's run directory, <run_dir>/coordinator.state:
 *
 *   {"pid": 1234, "draft": true, "target": true,
 *    "pairs": [{"draft": true, "target": true}, {"draft": false, "target": true}]}
 *
 * ("draft" and "target": pair 0's workers; "pairs": every pair's, in the
 * order of the config's "pairs")
 * rewritten (atomically, mode 0600) whenever that changes, removed when the
 * coordinator stops. `tandem-supervisor start --wait` reads it: the
 * coordinator's client endpoint may need CURVE keys the supervisor does not
 * hold, a file in the private run directory needs none. A run directory
 * that does not exist (a coordinator started by hand) is not an error: the
 * file is then not written.
 */
#ifndef TANDEM_COORDINATOR_READINESS_H
#define TANDEM_COORDINATOR_READINESS_H

struct coordinator;

/* Writes the file if the workers' state changed since the last write. */
void readiness_publish(struct coordinator *c);
/* Removes the file (the coordinator is going away). */
void readiness_withdraw(struct coordinator *c);

#endif
