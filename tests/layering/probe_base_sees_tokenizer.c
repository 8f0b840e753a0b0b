/* Must not compile: the base room does not depend on the room of tokenizer.h
 * (tests/layering/CMakeLists.txt checks the compiler's refusal). */
#include "tokenizer.h"
