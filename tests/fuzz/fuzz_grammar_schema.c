/* fuzz_grammar_schema.c: a JSON schema from fuzz bytes through
 * grammar_schema_compile_text (json_check, then the compiler); a schema that
 * compiles is run (fuzz_grammar_check.h). Refusals must name something. */
#include "fuzz_common.h"
#include "fuzz_grammar_check.h"

#include "grammar_schema.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[ERR_MSG_MAX] = "";
    struct grammar *g = NULL;
    if (grammar_schema_compile_text((const char *)data, size, "schema", &g, err) != 0) {
        if (g || err[0] == 0)
            abort();
        return 0;
    }
    fuzz_grammar_exercise(g, data, size);
    return 0;
}
