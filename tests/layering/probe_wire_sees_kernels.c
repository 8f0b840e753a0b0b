/* Must not compile: the wire room does not depend on the room of kernels.h
 * (tests/layering/CMakeLists.txt checks the compiler's refusal). */
#include "kernels.h"
