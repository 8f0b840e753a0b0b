/* main.c: tandem-draft-worker. The process is worker/worker_main.h's (exit
 * status there) running the draft role of draft_worker.h. */
#include "draft_worker.h"
#include "worker_main.h"

int main(int argc, char **argv)
{
    return worker_main(argc, argv, &draft_worker_role);
}
