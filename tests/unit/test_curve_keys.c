/* test_curve_keys.c: CURVE key files and endpoint locality. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>
#include <zmq.h>

#include "curve_keys.h"
#include "error.h"

static void write_file(const char *path, const char *text, mode_t mode)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    assert_int_equal(chmod(path, mode), 0);
}

static void test_curve_keys_secret_file_loads_and_gives_its_public_key(void **state)
{
    (void)state;
    char pub[41], sec[41], err[ERR_MSG_MAX] = "";
    assert_int_equal(zmq_curve_keypair(pub, sec), 0);
    char dir[] = "/tmp/tandem-curve-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[256], text[64];
    snprintf(path, sizeof path, "%s/server.key", dir);
    snprintf(text, sizeof text, "  %s\n", sec);
    write_file(path, text, 0600);
    char got[CURVE_KEY_Z85_SIZE], derived[CURVE_KEY_Z85_SIZE];
    assert_int_equal(curve_key_load(path, true, got, err), 0);
    assert_string_equal(got, sec);
    assert_int_equal(curve_key_public(got, derived, err), 0);
    assert_string_equal(derived, pub);

    /* readable by others: refused for a secret key, fine for a public one */
    assert_int_equal(chmod(path, 0644), 0);
    assert_int_equal(curve_key_load(path, true, got, err), ERR_INVALID_ARG);
    assert_non_null(strstr(err, "chmod 600"));
    assert_int_equal(curve_key_load(path, false, got, err), 0);

    /* not a key */
    write_file(path, "hello\n", 0600);
    assert_int_equal(curve_key_load(path, true, got, err), ERR_FORMAT);
    assert_non_null(strstr(err, path));

    /* a list with comments, and a bad line named */
    char list[256];
    snprintf(list, sizeof list, "%s/clients", dir);
    char pub2[41], sec2[41];
    assert_int_equal(zmq_curve_keypair(pub2, sec2), 0);
    char body[256];
    snprintf(body, sizeof body, "# admitted clients\n%s\n\n%s  # the gateway\n", pub, pub2);
    write_file(list, body, 0644);
    char keys[4][CURVE_KEY_Z85_SIZE];
    int n = 0;
    assert_int_equal(curve_keys_load_list(list, keys, 4, &n, err), 0);
    assert_int_equal(n, 2);
    assert_string_equal(keys[1], pub2);
    assert_int_equal(curve_keys_load_list(list, keys, 1, &n, err), ERR_RANGE);
    snprintf(body, sizeof body, "%s\nnot-a-key\n", pub);
    write_file(list, body, 0644);
    assert_int_equal(curve_keys_load_list(list, keys, 4, &n, err), ERR_FORMAT);
    assert_non_null(strstr(err, ":2"));
    unlink(path);
    unlink(list);
    rmdir(dir);
}

static void test_curve_keys_endpoint_locality(void **state)
{
    (void)state;
    assert_true(curve_endpoint_is_local("ipc:///tmp/x.sock"));
    assert_true(curve_endpoint_is_local("inproc://x"));
    assert_true(curve_endpoint_is_local("tcp://127.0.0.1:5555"));
    assert_true(curve_endpoint_is_local("tcp://127.1.2.3:5555"));
    assert_true(curve_endpoint_is_local("tcp://localhost:5555"));
    assert_true(curve_endpoint_is_local("tcp://[::1]:5555"));
    assert_false(curve_endpoint_is_local("tcp://*:5555"));
    assert_false(curve_endpoint_is_local("tcp://0.0.0.0:5555"));
    assert_false(curve_endpoint_is_local("tcp://192.0.2.7:5555"));
    assert_false(curve_endpoint_is_local("tcp://127.0.0.1.example.com:5555"));
    assert_false(curve_endpoint_is_local("tcp://eth0:5555"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_curve_keys_secret_file_loads_and_gives_its_public_key),
        cmocka_unit_test(test_curve_keys_endpoint_locality),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
