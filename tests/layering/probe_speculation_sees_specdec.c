/* Must not compile: the speculation room does not depend on the room of specdec.h
 * (tests/layering/CMakeLists.txt checks the compiler's refusal). */
#include "specdec.h"
