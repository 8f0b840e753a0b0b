/* Must not compile: the speculation room does not depend on the room of llama.h
 * (tests/layering/CMakeLists.txt checks the compiler's refusal). */
#include "llama.h"
