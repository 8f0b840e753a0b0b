/* Must not compile: the coordinator's core library (tandem_coord_core) does
 * not depend on the room of llama.h, even though in-process callers link it
 * beside the model (tests/layering/CMakeLists.txt checks the refusal). */
#include "llama.h"
