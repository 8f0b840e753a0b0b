/* test_worker_grammar.c: a worker's per-slot grammars (worker/
 * worker_grammar.c): a slot takes a grammar's wire form and drops it with
 * the next prompt; a model directory without a tokenizer refuses every
 * grammar by name, and keeps that answer (the tokenizer is not parsed again
 * per request: a tokenizer put there afterwards is not read). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <cmocka.h>

#include "error.h"
#include "model_config.h"
#include "tmpdir_fixture.h"
#include "worker_grammar.h"

static int setup(void **state)
{
    return tmpdir_fixture_setup(state, "tandem_worker_grammar");
}

static int teardown(void **state)
{
    return tmpdir_fixture_teardown(state);
}

static void copy_file(const char *from, const char *to)
{
    FILE *in = fopen(from, "rb"), *out = fopen(to, "wb");
    assert_non_null(in);
    assert_non_null(out);
    char buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, in)) > 0)
        assert_int_equal(fwrite(buf, 1, n, out), n);
    assert_int_equal(fclose(in), 0);
    assert_int_equal(fclose(out), 0);
}

static cJSON *gbnf(const char *text)
{
    cJSON *g = cJSON_CreateObject();
    assert_non_null(g);
    assert_non_null(cJSON_AddStringToObject(g, "type", "gbnf"));
    assert_non_null(cJSON_AddStringToObject(g, "text", text));
    return g;
}

static void test_slots_take_and_drop_grammars(void **state)
{
    (void)state;
    char dir[1024], err[ERR_MSG_MAX] = "";
    snprintf(dir, sizeof dir, "%s/models/trained/target", TANDEM_TEST_SOURCE_DIR);
    char cfg_path[1100];
    snprintf(cfg_path, sizeof cfg_path, "%s/config.json", dir);
    struct model_config mc;
    assert_int_equal(model_config_load(&mc, cfg_path, err), 0);
    struct worker_grammar *wg = NULL;
    assert_int_equal(worker_grammar_create(&wg, dir, &mc, 2, err), 0);
    cJSON *g = gbnf("root ::= \"yes\" | \"no\"");
    assert_int_equal(worker_grammar_set(wg, 1, g, 5, err), 0);
    assert_null(worker_grammar_slot(wg, 0));
    struct specdec_grammar *s = worker_grammar_slot(wg, 1);
    assert_non_null(s);
    assert_int_equal(s->n_prompt, 5);
    assert_int_equal(s->eos.n, mc.n_eos_token_ids);
    assert_int_equal(worker_grammar_set(wg, 1, NULL, 3, err), 0); /* the next prompt: none */
    assert_null(worker_grammar_slot(wg, 1));
    assert_int_equal(worker_grammar_set(wg, 2, g, 5, err), ERR_RANGE);
    cJSON_Delete(g);
    worker_grammar_destroy(wg);
}

static void test_no_tokenizer_is_refused_and_kept(void **state)
{
    struct tmpdir_fixture *f = *state;
    char src[1024], dst[1024], err[ERR_MSG_MAX] = "";
    snprintf(src, sizeof src, "%s/models/trained/target/config.json", TANDEM_TEST_SOURCE_DIR);
    snprintf(dst, sizeof dst, "%s/config.json", f->dir);
    copy_file(src, dst);
    struct model_config mc;
    assert_int_equal(model_config_load(&mc, dst, err), 0);
    struct worker_grammar *wg = NULL;
    assert_int_equal(worker_grammar_create(&wg, f->dir, &mc, 1, err), 0);
    cJSON *g = gbnf("root ::= \"a\"");
    const int rc = worker_grammar_set(wg, 0, g, 1, err);
    assert_int_not_equal(rc, 0);
    assert_non_null(strstr(err, "needs its model's tokenizer"));
    assert_null(worker_grammar_slot(wg, 0));
    /* a tokenizer arriving later is not read: the answer was kept */
    snprintf(src, sizeof src, "%s/models/trained/target/tokenizer.json", TANDEM_TEST_SOURCE_DIR);
    snprintf(dst, sizeof dst, "%s/tokenizer.json", f->dir);
    copy_file(src, dst);
    err[0] = 0;
    assert_int_equal(worker_grammar_set(wg, 0, g, 1, err), rc);
    assert_non_null(strstr(err, "needs its model's tokenizer"));
    cJSON_Delete(g);
    worker_grammar_destroy(wg);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_slots_take_and_drop_grammars),
        cmocka_unit_test_setup_teardown(test_no_tokenizer_is_refused_and_kept, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
