/* fuzz_grammar_gbnf.c: grammar text from fuzz bytes through grammar_gbnf_parse;
 * a grammar that parses is run (fuzz_grammar_check.h). Refusals must name
 * something. */
#include "fuzz_common.h"
#include "fuzz_grammar_check.h"

#include "grammar_gbnf.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[ERR_MSG_MAX] = "";
    struct grammar *g = NULL;
    if (grammar_gbnf_parse((const char *)data, size, &g, err) != 0) {
        if (g || err[0] == 0)
            abort();
        return 0;
    }
    fuzz_grammar_exercise(g, data, size);
    return 0;
}
