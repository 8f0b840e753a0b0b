/* main.c: tandem-target-worker. The process is worker/worker_main.h's (exit
 * status there) running the target role of target_worker.h. */
#include "target_worker.h"
#include "worker_main.h"

int main(int argc, char **argv)
{
    return worker_main(argc, argv, &target_worker_role);
}
