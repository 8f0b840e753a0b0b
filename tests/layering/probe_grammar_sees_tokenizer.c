/* Must not compile: the grammar room takes a vocabulary as byte strings and
 * does not depend on the room of tokenizer.h (tests/layering/CMakeLists.txt
 * checks the compiler's refusal). */
#include "tokenizer.h"
