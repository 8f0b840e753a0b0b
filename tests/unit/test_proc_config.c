/* test_proc_config.c: the process config file, overrides and validation. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "error.h"
#include "proc_config.h"

static int load(struct proc_config *cfg, const char *json, char *err)
{
    proc_config_defaults(cfg);
    return proc_config_load_json(cfg, json, "test.json", err);
}

static void test_proc_config_defaults_match_the_brief(void **state)
{
    (void)state;
    struct proc_config cfg;
    char err[ERR_MSG_MAX] = "";
    proc_config_defaults(&cfg);
    assert_int_equal(proc_config_set(&cfg, "target_worker.model", "/m/target", err), 0);
    assert_int_equal(proc_config_set(&cfg, "draft_worker.model", "/m/draft", err), 0);
    assert_int_equal(proc_config_finalize(&cfg, PROC_CONFIG_COORDINATOR | PROC_CONFIG_DRAFT |
                                                    PROC_CONFIG_TARGET,
                                          err),
                     0);
    assert_string_equal(cfg.instance, "tandem");
    assert_string_equal(cfg.coordinator.client_endpoint, "tcp://127.0.0.1:5555");
    assert_string_equal(cfg.coordinator.worker_endpoint, "ipc:///tmp/tandem-tandem/workers.sock");
    assert_string_equal(cfg.coordinator.tokenizer, "/m/target");
    assert_int_equal(cfg.coordinator.max_concurrency, 8);
    assert_int_equal(cfg.coordinator.max_queue, 64);
    assert_int_equal(cfg.coordinator.heartbeat_ms, 500);
    assert_int_equal(cfg.coordinator.worker_timeout_ms, 3000);
    assert_int_equal(cfg.coordinator.request_timeout_ms, 600000);
    assert_int_equal(cfg.coordinator.max_message_bytes, 1048576);
    assert_int_equal(cfg.coordinator.spec_k, 0);
    assert_int_equal(cfg.coordinator.spec_k_max, 8);
    assert_string_equal(cfg.coordinator.spec_mode, "sampled");
    assert_string_equal(cfg.coordinator.draft, "auto");
    assert_string_equal(cfg.coordinator.spec_tree, "auto");
    assert_int_equal(cfg.coordinator.suffix_cache_mib, 64);
    assert_string_equal(cfg.coordinator.log_level, "info");
    assert_string_equal(cfg.draft_worker.shm_transport, "auto");
    assert_int_equal(cfg.draft_worker.shm_staging, 0);
    assert_int_equal(cfg.draft_worker.argmax_copy, 1);
    assert_int_equal(cfg.target_worker.argmax_copy, 1);
    assert_int_equal(cfg.draft_worker.cuda_graphs, 1);
    assert_int_equal(cfg.target_worker.cuda_graphs, 1);
    assert_string_equal(cfg.draft_worker.sampler, "host"); /* auto on the cpu backend */
    assert_int_equal(cfg.supervisor.mps, 0);
    assert_string_equal(cfg.draft_worker.backend, "cpu");
    assert_int_equal(cfg.draft_worker.max_seq_len, 8192);
    assert_int_equal(cfg.draft_worker.heartbeat_ms, 500);
    assert_string_equal(cfg.draft_worker.coordinator_endpoint, "ipc:///tmp/tandem-tandem/workers.sock");
    assert_string_equal(cfg.target_worker.coordinator_endpoint,
                        "ipc:///tmp/tandem-tandem/workers.sock");
}

static void test_proc_config_file_values_are_loaded(void **state)
{
    (void)state;
    struct proc_config cfg;
    char err[ERR_MSG_MAX] = "";
    const char *json = "{\"instance\":\"blue\","
                       "\"coordinator\":{\"max_concurrency\":3,\"spec_mode\":\"point_mass\","
                       "\"client_endpoint\":\"tcp://*:6000\",\"insecure\":1},"
                       "\"draft_worker\":{\"model\":\"/d\",\"device\":0,\"threads\":2,"
                       "\"argmax_copy\":0},"
                       "\"target_worker\":{\"model\":\"/t\",\"backend\":\"cuda\","
                       "\"device\":\"GPU-1234-abcd\",\"cuda_graphs\":0}}";
    assert_int_equal(load(&cfg, json, err), 0);
    assert_int_equal(proc_config_finalize(&cfg, PROC_CONFIG_COORDINATOR | PROC_CONFIG_DRAFT |
                                                    PROC_CONFIG_TARGET,
                                          err),
                     0);
    assert_string_equal(cfg.instance, "blue");
    assert_string_equal(cfg.coordinator.worker_endpoint, "ipc:///tmp/tandem-blue/workers.sock");
    assert_int_equal(cfg.coordinator.max_concurrency, 3);
    assert_string_equal(cfg.coordinator.spec_mode, "point_mass");
    assert_string_equal(cfg.coordinator.client_endpoint, "tcp://*:6000");
    assert_string_equal(cfg.draft_worker.device, "0");
    assert_int_equal(cfg.draft_worker.threads, 2);
    assert_int_equal(cfg.draft_worker.argmax_copy, 0);
    assert_int_equal(cfg.target_worker.argmax_copy, 1);
    assert_int_equal(cfg.target_worker.cuda_graphs, 0);
    assert_int_equal(cfg.draft_worker.cuda_graphs, 1);
    assert_string_equal(cfg.target_worker.backend, "cuda");
    assert_string_equal(cfg.target_worker.device, "GPU-1234-abcd");
    assert_string_equal(cfg.coordinator.tokenizer, "/t");
    assert_string_equal(cfg.target_worker.sampler, "device"); /* auto on the cuda backend */
}

static void test_proc_config_sampler_follows_the_backend(void **state)
{
    (void)state;
    struct proc_config cfg;
    char err[ERR_MSG_MAX] = "";
    /* device sampling needs the GPU: named, with the way out */
    assert_int_equal(load(&cfg, "{\"draft_worker\":{\"model\":\"/d\",\"sampler\":\"device\"}}",
                          err), 0);
    assert_int_equal(proc_config_finalize(&cfg, PROC_CONFIG_DRAFT, err), ERR_INVALID_ARG);
    assert_string_equal(err, "draft_worker.sampler: \"device\" needs backend \"cuda\", the backend "
                             "is \"cpu\" (use \"host\" or \"auto\")");
    assert_int_equal(load(&cfg, "{\"target_worker\":{\"model\":\"/t\",\"backend\":\"cpu\","
                                "\"sampler\":\"device\"}}", err), 0);
    assert_int_equal(proc_config_finalize(&cfg, PROC_CONFIG_TARGET, err), ERR_INVALID_ARG);
    assert_non_null(strstr(err, "target_worker.sampler: \"device\" needs backend \"cuda\""));
    /* explicit choices on cuda stay as given; host on cpu is fine */
    assert_int_equal(load(&cfg, "{\"draft_worker\":{\"model\":\"/d\",\"backend\":\"cuda\","
                                "\"sampler\":\"host\"},\"target_worker\":{\"model\":\"/t\","
                                "\"backend\":\"cuda\",\"sampler\":\"device\"}}", err), 0);
    assert_int_equal(proc_config_finalize(&cfg, PROC_CONFIG_DRAFT | PROC_CONFIG_TARGET, err), 0);
    assert_string_equal(cfg.draft_worker.sampler, "host");
    assert_string_equal(cfg.target_worker.sampler, "device");
    assert_int_equal(load(&cfg, "{\"draft_worker\":{\"model\":\"/d\",\"sampler\":\"host\"}}",
                          err), 0);
    assert_int_equal(proc_config_finalize(&cfg, PROC_CONFIG_DRAFT, err), 0);
    /* unknown values and the command line */
    assert_int_equal(load(&cfg, "{\"draft_worker\":{\"sampler\":\"gpu\"}}", err), ERR_INVALID_ARG);
    assert_non_null(strstr(err, "draft_worker.sampler: must be \"auto\", \"device\" or \"host\""));
    proc_config_defaults(&cfg);
    assert_int_equal(proc_config_set(&cfg, "target_worker.sampler", "host", err), 0);
    assert_string_equal(cfg.target_worker.sampler, "host");
    assert_int_equal(proc_config_set(&cfg, "target_worker.sampler", "cuda", err), ERR_INVALID_ARG);
}

static void test_proc_config_missing_model_names_the_key(void **state)
{
    (void)state;
    struct proc_config cfg;
    char err[ERR_MSG_MAX] = "";
    assert_int_equal(load(&cfg, "{\"target_worker\":{\"model\":\"/t\"}}", err), 0);
    assert_int_equal(proc_config_finalize(&cfg, PROC_CONFIG_DRAFT, err), ERR_INVALID_ARG);
    assert_string_equal(err, "draft_worker.model: required");
    /* The target section alone is fine. */
    assert_int_equal(proc_config_finalize(&cfg, PROC_CONFIG_TARGET, err), 0);
}

static void test_proc_config_wrong_type_names_key_and_type(void **state)
{
    (void)state;
    struct proc_config cfg;
    char err[ERR_MSG_MAX] = "";
    assert_int_equal(load(&cfg, "{\"coordinator\":{\"max_concurrency\":\"8\"}}", err),
                     ERR_INVALID_ARG);
    assert_non_null(strstr(err, "coordinator.max_concurrency: expected an integer, got string"));
    assert_int_equal(load(&cfg, "{\"coordinator\":{\"max_queue\":1.5}}", err), ERR_INVALID_ARG);
    assert_non_null(strstr(err, "coordinator.max_queue: expected an integer"));
    assert_int_equal(load(&cfg, "{\"draft_worker\":{\"model\":7}}", err), ERR_INVALID_ARG);
    assert_non_null(strstr(err, "draft_worker.model: expected a string, got number"));
    assert_int_equal(load(&cfg, "{\"draft_worker\":[]}", err), ERR_INVALID_ARG);
    assert_non_null(strstr(err, "draft_worker: expected an object, got array"));
}

/* Every 0/1 key takes JSON true and false too, in every section, and
 * "true"/"false" on the command line; other types are still refused. */
static void test_proc_config_boolean_keys_take_json_booleans(void **state)
{
    (void)state;
    struct proc_config cfg;
    char err[ERR_MSG_MAX] = "";
    assert_int_equal(load(&cfg,
                          "{\"gateway\":{\"allow_unauthenticated\":true,\"metrics_require_key\":false},"
                          "\"coordinator\":{\"insecure\":true,\"worker_lane\":false},"
                          "\"target_worker\":{\"model\":\"/m/t\",\"prefix_cache\":false,\"cuda_graphs\":true},"
                          "\"supervisor\":{\"mps\":true}}",
                          err),
                     0);
    assert_int_equal(cfg.gateway.allow_unauthenticated, 1);
    assert_int_equal(cfg.gateway.metrics_require_key, 0);
    assert_int_equal(cfg.coordinator.insecure, 1);
    assert_int_equal(cfg.coordinator.worker_lane, 0);
    assert_int_equal(cfg.target_worker.prefix_cache, 0);
    assert_int_equal(cfg.target_worker.cuda_graphs, 1);
    assert_int_equal(cfg.supervisor.mps, 1);
    assert_int_equal(proc_config_set(&cfg, "gateway.allow_unauthenticated", "false", err), 0);
    assert_int_equal(cfg.gateway.allow_unauthenticated, 0);
    assert_int_equal(proc_config_set(&cfg, "coordinator.insecure", "false", err), 0);
    assert_int_equal(cfg.coordinator.insecure, 0);
    assert_int_equal(load(&cfg, "{\"gateway\":{\"allow_unauthenticated\":\"yes\"}}", err), ERR_INVALID_ARG);
    assert_non_null(strstr(err, "gateway.allow_unauthenticated: expected true, false, 1 or 0, got string"));
    /* a key with a wider range is no boolean */
    assert_int_equal(load(&cfg, "{\"coordinator\":{\"max_queue\":true}}", err), ERR_INVALID_ARG);
    assert_non_null(strstr(err, "coordinator.max_queue: expected an integer"));
    assert_int_equal(proc_config_set(&cfg, "coordinator.max_queue", "true", err), ERR_INVALID_ARG);
}

static void test_proc_config_unknown_keys_are_rejected(void **state)
{
    (void)state;
    struct proc_config cfg;
    char err[ERR_MSG_MAX] = "";
    assert_int_equal(load(&cfg, "{\"coordinator\":{\"foo\":1}}", err), ERR_INVALID_ARG);
    assert_non_null(strstr(err, "coordinator.foo: unknown key"));
    assert_int_equal(load(&cfg, "{\"workers\":{}}", err), ERR_INVALID_ARG);
    assert_non_null(strstr(err, "workers: unknown key"));
    assert_int_equal(load(&cfg, "{\"coordinator\":{\"max_queue\":1,\"max_queue\":2}}", err),
                     ERR_INVALID_ARG);
    assert_non_null(strstr(err, "coordinator.max_queue: duplicate key"));
    proc_config_defaults(&cfg);
    assert_int_equal(proc_config_set(&cfg, "draft_worker.nope", "1", err), ERR_INVALID_ARG);
    assert_string_equal(err, "draft_worker.nope: unknown key");
    /* a near miss names the key meant */
    assert_int_equal(load(&cfg, "{\"target_worker\":{\"max_seqlen\":64}}", err), ERR_INVALID_ARG);
    assert_non_null(strstr(err, "target_worker.max_seqlen: unknown key (did you mean \"max_seq_len\"?)"));
    assert_int_equal(load(&cfg, "{\"coordinator\":{\"max-queue\":1}}", err), ERR_INVALID_ARG);
    assert_non_null(strstr(err, "coordinator.max-queue: unknown key (did you mean \"max_queue\"?)"));
}

static void test_proc_config_enum_and_range_errors_name_the_key(void **state)
{
    (void)state;
    struct proc_config cfg;
    char err[ERR_MSG_MAX] = "";
    assert_int_equal(load(&cfg, "{\"target_worker\":{\"backend\":\"tpu\"}}", err),
                     ERR_INVALID_ARG);
    assert_non_null(strstr(err, "target_worker.backend: must be \"cpu\" or \"cuda\", got \"tpu\""));
    assert_int_equal(load(&cfg, "{\"coordinator\":{\"max_concurrency\":0}}", err),
                     ERR_INVALID_ARG);
    assert_non_null(strstr(err, "coordinator.max_concurrency: must be in 1..4096, got 0"));
    assert_int_equal(load(&cfg, "{\"coordinator\":{\"spec_mode\":\"greedy\"}}", err),
                     ERR_INVALID_ARG);
    assert_non_null(strstr(err, "coordinator.spec_mode"));
    assert_int_equal(load(&cfg, "{\"coordinator\":{\"draft\":\"eagle\"}}", err), ERR_INVALID_ARG);
    assert_non_null(strstr(err, "coordinator.draft: must be \"auto\", \"model\", \"ngram\", \"suffix\" or \"none\", got \"eagle\""));
    assert_int_equal(load(&cfg, "{\"coordinator\":{\"draft\":\"ngram\"}}", err), 0);
    assert_string_equal(cfg.coordinator.draft, "ngram");
    assert_int_equal(load(&cfg, "{\"coordinator\":{\"spec_tree\":\"33\"}}", err), ERR_INVALID_ARG);
    assert_non_null(strstr(err, "coordinator.spec_tree: must be \"off\", \"auto\" or a node budget 2..32, got \"33\""));
    assert_int_equal(load(&cfg, "{\"coordinator\":{\"spec_tree\":\"16\"}}", err), 0);
    assert_string_equal(cfg.coordinator.spec_tree, "16");
    assert_int_equal(load(&cfg, "{\"coordinator\":{\"log_level\":\"loud\"}}", err),
                     ERR_INVALID_ARG);
    assert_non_null(strstr(err, "coordinator.log_level"));
    assert_int_equal(load(&cfg, "{\"draft_worker\":{\"shm_transport\":\"nccl\"}}", err),
                     ERR_INVALID_ARG);
    assert_non_null(strstr(err, "draft_worker.shm_transport: must be"));
    assert_int_equal(load(&cfg, "{\"target_worker\":{\"argmax_copy\":2}}", err), ERR_INVALID_ARG);
    assert_non_null(strstr(err, "target_worker.argmax_copy: must be in 0..1, got 2"));
    assert_int_equal(load(&cfg, "{\"draft_worker\":{\"cuda_graphs\":-1}}", err), ERR_INVALID_ARG);
    assert_non_null(strstr(err, "draft_worker.cuda_graphs: must be in 0..1, got -1"));
    assert_int_equal(load(&cfg, "{\"supervisor\":{\"mps\":2}}", err), ERR_INVALID_ARG);
    assert_non_null(strstr(err, "supervisor.mps"));
    assert_int_equal(load(&cfg, "{\"instance\":\"a/b\"}", err), ERR_INVALID_ARG);
    assert_non_null(strstr(err, "instance: must be"));
    assert_int_equal(load(&cfg, "{\"coordinator\":{\"spec_k\":9,\"spec_k_max\":4}}", err), 0);
    assert_int_equal(proc_config_set(&cfg, "target_worker.model", "/t", err), 0);
    assert_int_equal(proc_config_finalize(&cfg, PROC_CONFIG_COORDINATOR, err), ERR_INVALID_ARG);
    assert_non_null(strstr(err, "coordinator.spec_k: must be <="));
}

static void test_proc_config_bad_endpoints_are_rejected(void **state)
{
    (void)state;
    char err[ERR_MSG_MAX] = "";
    assert_int_equal(proc_config_check_endpoint("tcp://127.0.0.1:5555", err), 0);
    assert_int_equal(proc_config_check_endpoint("tcp://*:5555", err), 0);
    assert_int_equal(proc_config_check_endpoint("tcp://[::1]:5555", err), 0);
    assert_int_equal(proc_config_check_endpoint("ipc:///tmp/x", err), 0);
    assert_int_equal(proc_config_check_endpoint("inproc://w", err), 0);
    assert_int_equal(proc_config_check_endpoint("tcp://host", err), ERR_INVALID_ARG);
    assert_int_equal(proc_config_check_endpoint("tcp://host:0", err), ERR_INVALID_ARG);
    assert_int_equal(proc_config_check_endpoint("tcp://host:70000", err), ERR_INVALID_ARG);
    assert_int_equal(proc_config_check_endpoint("tcp://:80", err), ERR_INVALID_ARG);
    assert_int_equal(proc_config_check_endpoint("ipc://", err), ERR_INVALID_ARG);
    assert_int_equal(proc_config_check_endpoint("inproc://", err), ERR_INVALID_ARG);
    assert_int_equal(proc_config_check_endpoint("http://x:1", err), ERR_INVALID_ARG);
    assert_int_equal(proc_config_check_endpoint("", err), ERR_INVALID_ARG);
    char longpath[200] = "ipc:///";
    memset(longpath + 7, 'a', 150);
    longpath[157] = '\0';
    assert_int_equal(proc_config_check_endpoint(longpath, err), ERR_INVALID_ARG);

    struct proc_config cfg;
    assert_int_equal(load(&cfg, "{\"coordinator\":{\"client_endpoint\":\"localhost:5555\"}}", err),
                     ERR_INVALID_ARG);
    assert_non_null(strstr(err, "coordinator.client_endpoint: bad endpoint"));
    proc_config_defaults(&cfg);
    assert_int_equal(proc_config_set(&cfg, "draft_worker.coordinator_endpoint", "tcp://x", err),
                     ERR_INVALID_ARG);
    assert_non_null(strstr(err, "draft_worker.coordinator_endpoint: bad endpoint"));
}

static void test_proc_config_set_parses_and_overrides(void **state)
{
    (void)state;
    struct proc_config cfg;
    char err[ERR_MSG_MAX] = "";
    assert_int_equal(load(&cfg, "{\"coordinator\":{\"max_queue\":5}}", err), 0);
    assert_int_equal(proc_config_set(&cfg, "coordinator.max-queue", "7", err), 0);
    assert_int_equal(cfg.coordinator.max_queue, 7);
    assert_int_equal(proc_config_set(&cfg, "coordinator.max_queue", "7x", err), ERR_INVALID_ARG);
    assert_string_equal(err, "coordinator.max_queue: expected an integer, got \"7x\"");
    assert_int_equal(proc_config_set(&cfg, "coordinator.max_queue", "", err), ERR_INVALID_ARG);
    assert_int_equal(proc_config_set(&cfg, "target_worker.device", "1", err), 0);
    assert_string_equal(cfg.target_worker.device, "1");
    assert_int_equal(proc_config_set(&cfg, "instance", "green", err), 0);
    assert_string_equal(cfg.instance, "green");
    assert_int_equal(cfg.coordinator.max_queue, 7);
}

static void test_proc_config_parse_args_file_then_flags(void **state)
{
    (void)state;
    char dir[] = "/tmp/tandem-test-config-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[256];
    snprintf(path, sizeof path, "%s/c.json", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("{\"draft_worker\":{\"model\":\"/file/draft\",\"threads\":3},"
          "\"coordinator\":{\"max_concurrency\":2}}",
          f);
    assert_int_equal(fclose(f), 0);

    struct proc_config cfg;
    char err[ERR_MSG_MAX] = "";
    char *argv[] = {"prog", "--model", "/cli/draft", "--config", path,
                    "--coordinator.max-concurrency=5", "--instance", "x1", NULL};
    int rc = proc_config_parse_args(&cfg, 8, argv, "draft_worker", PROC_CONFIG_DRAFT, err);
    assert_int_equal(rc, 0);
    assert_string_equal(cfg.draft_worker.model, "/cli/draft");
    assert_int_equal(cfg.draft_worker.threads, 3);
    assert_int_equal(cfg.coordinator.max_concurrency, 5);
    assert_string_equal(cfg.draft_worker.coordinator_endpoint, "ipc:///tmp/tandem-x1/workers.sock");

    char *argv2[] = {"prog", "--config", path, "--threads", "many", NULL};
    assert_int_equal(proc_config_parse_args(&cfg, 5, argv2, "draft_worker", PROC_CONFIG_DRAFT, err),
                     ERR_INVALID_ARG);
    assert_string_equal(err, "draft_worker.threads: expected an integer, got \"many\"");

    char *argv3[] = {"prog", "--model", NULL};
    assert_int_equal(proc_config_parse_args(&cfg, 2, argv3, "draft_worker", PROC_CONFIG_DRAFT, err),
                     ERR_INVALID_ARG);
    assert_non_null(strstr(err, "--model: missing value"));

    char *argv4[] = {"prog", "stray", NULL};
    assert_int_equal(proc_config_parse_args(&cfg, 2, argv4, "draft_worker", PROC_CONFIG_DRAFT, err),
                     ERR_INVALID_ARG);

    assert_int_equal(unlink(path), 0);
    char *argv5[] = {"prog", "--config", path, NULL};
    assert_int_equal(proc_config_parse_args(&cfg, 3, argv5, "draft_worker", PROC_CONFIG_DRAFT, err),
                     ERR_IO);
    assert_non_null(strstr(err, path));
    assert_int_equal(rmdir(dir), 0);
}

static void test_proc_config_malformed_json_is_a_format_error(void **state)
{
    (void)state;
    struct proc_config cfg;
    char err[ERR_MSG_MAX] = "";
    assert_int_equal(load(&cfg, "{\"coordinator\":", err), ERR_FORMAT);
    assert_non_null(strstr(err, "test.json: not valid JSON"));
    assert_int_equal(load(&cfg, "[1,2]", err), ERR_FORMAT);
}

static void test_proc_config_reachable_endpoints_need_an_explicit_choice(void **state)
{
    (void)state;
    struct proc_config cfg;
    char err[ERR_MSG_MAX] = "";
    const unsigned all = PROC_CONFIG_COORDINATOR | PROC_CONFIG_DRAFT | PROC_CONFIG_TARGET;
    /* a client endpoint other machines can reach, neither CURVE nor insecure */
    assert_int_equal(load(&cfg, "{\"coordinator\":{\"client_endpoint\":\"tcp://0.0.0.0:6000\"},"
                                "\"draft_worker\":{\"model\":\"/d\"},\"target_worker\":{\"model\":\"/t\"}}",
                          err),
                     0);
    assert_int_equal(proc_config_finalize(&cfg, all, err), ERR_INVALID_ARG);
    assert_non_null(strstr(err, "coordinator.client_endpoint"));
    assert_non_null(strstr(err, "curve_secret_key_file"));
    /* loopback needs nothing */
    assert_int_equal(load(&cfg, "{\"coordinator\":{\"client_endpoint\":\"tcp://127.0.0.2:6000\"},"
                                "\"draft_worker\":{\"model\":\"/d\"},\"target_worker\":{\"model\":\"/t\"}}",
                          err),
                     0);
    assert_int_equal(proc_config_finalize(&cfg, all, err), 0);
    /* CURVE client keys without a server key */
    assert_int_equal(load(&cfg, "{\"coordinator\":{\"curve_client_keys_file\":\"/k\"},"
                                "\"draft_worker\":{\"model\":\"/d\"},\"target_worker\":{\"model\":\"/t\"}}",
                          err),
                     0);
    assert_int_equal(proc_config_finalize(&cfg, all, err), ERR_INVALID_ARG);
    assert_non_null(strstr(err, "curve_client_keys_file"));
    /* a worker endpoint on the network, refused for workers too */
    assert_int_equal(load(&cfg, "{\"coordinator\":{\"worker_endpoint\":\"tcp://*:7000\"},"
                                "\"draft_worker\":{\"model\":\"/d\"},\"target_worker\":{\"model\":\"/t\"}}",
                          err),
                     0);
    assert_int_equal(proc_config_finalize(&cfg, PROC_CONFIG_TARGET, err), ERR_INVALID_ARG);
    assert_non_null(strstr(err, "external_workers"));
    assert_int_equal(load(&cfg, "{\"coordinator\":{\"worker_endpoint\":\"tcp://*:7000\","
                                "\"external_workers\":1},"
                                "\"draft_worker\":{\"model\":\"/d\"},\"target_worker\":{\"model\":\"/t\"}}",
                          err),
                     0);
    assert_int_equal(proc_config_finalize(&cfg, all, err), 0);
}

/* Every deploy/config*.json (the MPS one too) loads and validates; run
 * outside CTest it finds the tree it was built from. */
static void test_proc_config_deploy_examples_are_valid(void **state)
{
    (void)state;
    const char *src = getenv("TANDEM_SOURCE_DIR");
    if (!src)
        src = TANDEM_TEST_SOURCE_DIR;
    char deploy[1024];
    snprintf(deploy, sizeof deploy, "%s/deploy", src);
    DIR *dir = opendir(deploy);
    if (dir == NULL)
        fail_msg("%s: %s", deploy, strerror(errno));
    int n_checked = 0, has_mps = 0;
    for (struct dirent *e; (e = readdir(dir)) != NULL;) {
        const size_t len = strlen(e->d_name);
        if (strncmp(e->d_name, "config", 6) != 0 || len < 5 || strcmp(e->d_name + len - 5, ".json") != 0)
            continue;
        char path[1400];
        snprintf(path, sizeof path, "%s/%s", deploy, e->d_name);
        n_checked++;
        struct proc_config cfg;
        char err[ERR_MSG_MAX] = "";
        proc_config_defaults(&cfg);
        int rc = proc_config_load_file(&cfg, path, err);
        if (rc == 0)
            rc = proc_config_finalize(&cfg, PROC_CONFIG_COORDINATOR | PROC_CONFIG_DRAFT |
                                                PROC_CONFIG_TARGET,
                                      err);
        if (rc != 0)
            fail_msg("%s: %s", path, err);
        has_mps += cfg.supervisor.mps;
    }
    closedir(dir);
    assert_true(n_checked >= 5); /* cpu, 1gpu, 1gpu-mps, 2gpu, 4gpu-2pairs */
    assert_int_equal(has_mps, 1);
}

/* run_dir: the default worker socket lives in it; it is used only when it is
 * a real directory of ours with mode 0700. */
static void test_proc_config_run_dir_is_private(void **state)
{
    (void)state;
    char err[ERR_MSG_MAX] = "";
    char base[] = "/tmp/tandem-test-rundir-XXXXXX";
    assert_non_null(mkdtemp(base));
    char dir[128], target[160];
    snprintf(dir, sizeof dir, "%s/run", base);
    snprintf(target, sizeof target, "%s/elsewhere", base);
    struct proc_config cfg;
    proc_config_defaults(&cfg);
    assert_int_equal(proc_config_set(&cfg, "run_dir", dir, err), 0);
    assert_int_equal(proc_config_set(&cfg, "draft_worker.model", "/d", err), 0);
    assert_int_equal(proc_config_finalize(&cfg, PROC_CONFIG_DRAFT, err), 0);
    char expect[200];
    snprintf(expect, sizeof expect, "ipc://%s/workers.sock", dir);
    assert_string_equal(cfg.coordinator.worker_endpoint, expect);
    assert_string_equal(cfg.draft_worker.coordinator_endpoint, expect);
    /* created 0700 */
    assert_int_equal(proc_config_prepare_run_dir(&cfg, err), 0);
    struct stat st;
    assert_int_equal(lstat(dir, &st), 0);
    assert_true(S_ISDIR(st.st_mode) && (st.st_mode & 07777) == 0700);
    assert_int_equal(proc_config_prepare_run_dir(&cfg, err), 0); /* ours: accepted again */
    /* wrong mode */
    assert_int_equal(chmod(dir, 0755), 0);
    assert_int_equal(proc_config_prepare_run_dir(&cfg, err), ERR_INVALID_ARG);
    assert_non_null(strstr(err, "mode 0755, must be 0700"));
    assert_int_equal(rmdir(dir), 0);
    /* a planted symlink */
    assert_int_equal(mkdir(target, 0700), 0);
    assert_int_equal(symlink(target, dir), 0);
    assert_int_equal(proc_config_prepare_run_dir(&cfg, err), ERR_INVALID_ARG);
    assert_non_null(strstr(err, "is a symbolic link"));
    assert_int_equal(unlink(dir), 0);
    /* a foreign owner (only root can plant one here) */
    if (geteuid() == 0) {
        assert_int_equal(mkdir(dir, 0700), 0);
        assert_int_equal(chown(dir, 65534, 65534), 0);
        assert_int_equal(proc_config_prepare_run_dir(&cfg, err), ERR_INVALID_ARG);
        assert_non_null(strstr(err, "owned by uid 65534"));
        assert_int_equal(rmdir(dir), 0);
    }
    /* an endpoint placed elsewhere is the operator's choice: not checked */
    assert_int_equal(symlink(target, dir), 0);
    snprintf(cfg.coordinator.worker_endpoint, sizeof cfg.coordinator.worker_endpoint,
             "ipc://%s/w.sock", base);
    assert_int_equal(proc_config_prepare_run_dir(&cfg, err), 0);
    assert_int_equal(unlink(dir), 0);
    assert_int_equal(rmdir(target), 0);
    assert_int_equal(rmdir(base), 0);
    /* run_dir must be absolute and short enough for an ipc path */
    assert_int_equal(proc_config_set(&cfg, "run_dir", "relative/dir", err), ERR_INVALID_ARG);
    assert_non_null(strstr(err, "run_dir: must be an absolute path"));
}

static void test_proc_config_gateway_section_defaults_and_derived_keys(void **state)
{
    (void)state;
    struct proc_config cfg;
    char err[ERR_MSG_MAX] = "";
    assert_int_equal(load(&cfg,
                          "{\"coordinator\":{\"client_endpoint\":\"tcp://*:6000\"},"
                          "\"target_worker\":{\"model\":\"/m/llama-3b/\"},\"gateway\":{\"api_key_env\":\"GW_KEY\"}}",
                          err),
                     0);
    assert_int_equal(proc_config_finalize(&cfg, PROC_CONFIG_GATEWAY, err), 0);
    assert_string_equal(cfg.gateway.listen, "127.0.0.1:8000");
    assert_string_equal(cfg.gateway.coordinator_endpoint, "tcp://127.0.0.1:6000");
    assert_string_equal(cfg.gateway.served_model_name, "llama-3b");
    assert_string_equal(cfg.gateway.api_key_env, "GW_KEY");
    assert_int_equal(cfg.gateway.max_body_bytes, 1048576 - PROC_CONFIG_GATEWAY_ENVELOPE_BYTES);
    assert_int_equal(cfg.gateway.max_connections, 1024);
    assert_int_equal(cfg.gateway.max_connections_per_ip, 64);
    assert_int_equal(cfg.gateway.header_timeout_ms, 5000);
    assert_int_equal(cfg.gateway.body_timeout_ms, 10000);
    assert_int_equal(cfg.gateway.threads, 0);
    assert_int_equal(cfg.gateway.allow_unauthenticated, 0);
    assert_int_equal(cfg.gateway.metrics_require_key, 0);

    assert_int_not_equal(load(&cfg, "{\"gateway\":{\"listen\":\"127.0.0.1:0\"}}", err), 0);
    assert_non_null(strstr(err, "gateway.listen"));
    assert_int_not_equal(load(&cfg, "{\"gateway\":{\"api_key_env\":\"1X\"}}", err), 0);
    assert_non_null(strstr(err, "gateway.api_key_env"));
    assert_int_not_equal(load(&cfg, "{\"gateway\":{\"colour\":1}}", err), 0);
    assert_non_null(strstr(err, "gateway.colour: unknown key"));
}

/* The served name a gateway derives from target_worker.model: a HuggingFace
 * cache snapshot is served under its repository's name, not its commit. */
static void test_proc_config_gateway_served_name_of_hf_snapshot(void **state)
{
    (void)state;
    static const struct {
        const char *model, *served;
    } cases[] = {
        /* a snapshot: ORG/NAME, trailing slash or not */
        {"/h/hub/models--meta-llama--Llama-3.2-1B-Instruct/snapshots/"
         "9213176726f574b556790deb65791e0c5aa438b6",
         "meta-llama/Llama-3.2-1B-Instruct"},
        {"/h/hub/models--Qwen--Qwen2.5-0.5B/snapshots/0123456789abcdef0123456789abcdef01234567/",
         "Qwen/Qwen2.5-0.5B"},
        /* a repository without an organisation */
        {"hub/models--gpt2/snapshots/0123456789abcdef0123456789abcdef01234567", "gpt2"},
        /* not a snapshot: the basename as before (39 hex, capitals, another parent) */
        {"/h/hub/models--a--b/snapshots/0123456789abcdef0123456789abcdef0123456",
         "0123456789abcdef0123456789abcdef0123456"},
        {"/h/hub/models--a--b/snapshots/0123456789ABCDEF0123456789abcdef01234567",
         "0123456789ABCDEF0123456789abcdef01234567"},
        {"/h/hub/models--a--b/refs/0123456789abcdef0123456789abcdef01234567",
         "0123456789abcdef0123456789abcdef01234567"},
        {"/h/hub/datasets--a--b/snapshots/0123456789abcdef0123456789abcdef01234567",
         "0123456789abcdef0123456789abcdef01234567"},
        {"/m/llama-3b", "llama-3b"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct proc_config cfg;
        char err[ERR_MSG_MAX] = "";
        char json[512];
        snprintf(json, sizeof json, "{\"target_worker\":{\"model\":\"%s\"},\"gateway\":{}}", cases[i].model);
        assert_int_equal(load(&cfg, json, err), 0);
        assert_int_equal(proc_config_finalize(&cfg, PROC_CONFIG_GATEWAY, err), 0);
        if (strcmp(cfg.gateway.served_model_name, cases[i].served) != 0)
            fail_msg("case %zu: %s served as \"%s\", want \"%s\"", i, cases[i].model, cfg.gateway.served_model_name,
                     cases[i].served);
        assert_int_equal(cfg.gateway.strict_fields, 0);
    }
    /* an explicit name wins, and strict_fields is a 0/1 key */
    struct proc_config cfg;
    char err[ERR_MSG_MAX] = "";
    assert_int_equal(load(&cfg,
                          "{\"target_worker\":{\"model\":\"/h/models--a--b/snapshots/"
                          "0123456789abcdef0123456789abcdef01234567\"},\"gateway\":{\"served_model_name\":\"mine\","
                          "\"strict_fields\":true}}",
                          err),
                     0);
    assert_int_equal(proc_config_finalize(&cfg, PROC_CONFIG_GATEWAY, err), 0);
    assert_string_equal(cfg.gateway.served_model_name, "mine");
    assert_int_equal(cfg.gateway.strict_fields, 1);
}

/* draft_configured: a draft_worker section (or key) makes the deployment
 * one with drafts; without one it is target-only (no draft series). */
static void test_proc_config_draft_configured_by_its_section(void **state)
{
    (void)state;
    struct proc_config cfg;
    char err[ERR_MSG_MAX] = "";
    assert_int_equal(load(&cfg, "{\"target_worker\":{\"model\":\"/m/t\"}}", err), 0);
    assert_false(cfg.draft_configured);
    assert_int_equal(load(&cfg, "{\"target_worker\":{\"model\":\"/m/t\"},\"draft_worker\":{}}", err), 0);
    assert_true(cfg.draft_configured);
    proc_config_defaults(&cfg);
    assert_false(cfg.draft_configured);
    assert_int_equal(proc_config_set(&cfg, "draft_worker.model", "/m/d", err), 0);
    assert_true(cfg.draft_configured);
}

/* A gateway in front of a CURVE coordinator of the same config needs its
 * public key, and its own key pair where the coordinator lists clients:
 * told at start, not by a refused first request. */
static void test_proc_config_gateway_to_a_curve_coordinator_needs_its_keys(void **state)
{
    (void)state;
    struct proc_config cfg;
    char err[ERR_MSG_MAX] = "";
    const char *curve = "{\"coordinator\":{\"curve_secret_key_file\":\"/k/server.key\"},"
                        "\"target_worker\":{\"model\":\"/m/t\"},\"gateway\":{}}";
    assert_int_equal(load(&cfg, curve, err), 0);
    assert_int_equal(proc_config_finalize(&cfg, PROC_CONFIG_GATEWAY, err), ERR_INVALID_ARG);
    assert_non_null(strstr(err, "gateway.coordinator_curve_public_key_file: required"));
    assert_int_equal(load(&cfg, curve, err), 0);
    assert_int_equal(proc_config_set(&cfg, "gateway.coordinator_curve_public_key_file", "/k/server.pub", err), 0);
    assert_int_equal(proc_config_finalize(&cfg, PROC_CONFIG_GATEWAY, err), 0);
    /* the coordinator's own checks are not the gateway's concern */
    assert_int_equal(load(&cfg, curve, err), 0);
    assert_int_equal(proc_config_finalize(&cfg, PROC_CONFIG_TARGET, err), 0);

    const char *listed = "{\"coordinator\":{\"curve_secret_key_file\":\"/k/server.key\","
                         "\"curve_client_keys_file\":\"/k/clients\"},\"target_worker\":{\"model\":\"/m/t\"},"
                         "\"gateway\":{\"coordinator_curve_public_key_file\":\"/k/server.pub\"}}";
    assert_int_equal(load(&cfg, listed, err), 0);
    assert_int_equal(proc_config_finalize(&cfg, PROC_CONFIG_GATEWAY, err), ERR_INVALID_ARG);
    assert_non_null(strstr(err, "gateway.curve_secret_key_file: required"));
    assert_int_equal(load(&cfg, listed, err), 0);
    assert_int_equal(proc_config_set(&cfg, "gateway.curve_secret_key_file", "/k/gw.key", err), 0);
    assert_int_equal(proc_config_finalize(&cfg, PROC_CONFIG_GATEWAY, err), 0);

    /* a secret key without the server's key is a mistake wherever the coordinator is */
    assert_int_equal(load(&cfg,
                          "{\"target_worker\":{\"model\":\"/m/t\"},\"gateway\":{\"coordinator_endpoint\":"
                          "\"tcp://10.0.0.2:5555\",\"curve_secret_key_file\":\"/k/gw.key\"}}",
                          err),
                     0);
    assert_int_equal(proc_config_finalize(&cfg, PROC_CONFIG_GATEWAY, err), ERR_INVALID_ARG);
    assert_non_null(strstr(err, "needs gateway.coordinator_curve_public_key_file"));
}

/* A body the gateway takes must be a message the coordinator takes: the
 * derived limit follows coordinator.max_message_bytes, and an explicit one
 * the coordinator could not take is refused at start, naming both keys. */
static void test_proc_config_gateway_body_limit_fits_the_coordinator(void **state)
{
    (void)state;
    struct proc_config cfg;
    char err[ERR_MSG_MAX] = "";
    assert_int_equal(
        load(&cfg, "{\"coordinator\":{\"max_message_bytes\":65536},\"target_worker\":{\"model\":\"/m/t\"}}", err),
        0);
    assert_int_equal(proc_config_finalize(&cfg, PROC_CONFIG_GATEWAY, err), 0);
    assert_int_equal(cfg.gateway.max_body_bytes, 65536 - PROC_CONFIG_GATEWAY_ENVELOPE_BYTES);

    const char *over = "{\"coordinator\":{\"max_message_bytes\":65536},\"target_worker\":{\"model\":\"/m/t\"},"
                       "\"gateway\":{\"max_body_bytes\":65536}}";
    assert_int_equal(load(&cfg, over, err), 0);
    assert_int_equal(proc_config_finalize(&cfg, PROC_CONFIG_GATEWAY, err), ERR_INVALID_ARG);
    assert_non_null(strstr(err, "gateway.max_body_bytes"));
    assert_non_null(strstr(err, "coordinator.max_message_bytes"));
    /* the coordinator alone does not care about the gateway's keys */
    assert_int_equal(load(&cfg, over, err), 0);
    assert_int_equal(proc_config_finalize(&cfg, PROC_CONFIG_TARGET, err), 0);

    assert_int_equal(load(&cfg, over, err), 0);
    assert_int_equal(proc_config_set(&cfg, "gateway.max_body_bytes", "65024", err), 0);
    assert_int_equal(proc_config_finalize(&cfg, PROC_CONFIG_GATEWAY, err), 0);
    assert_int_equal(cfg.gateway.max_body_bytes, 65024);
}

/* An HTTP address other machines reach needs an API key, or the operator's
 * explicit allow_unauthenticated; metrics_require_key needs a key to require. */
static void test_proc_config_gateway_exposure_needs_a_key_or_a_choice(void **state)
{
    (void)state;
    struct proc_config cfg;
    char err[ERR_MSG_MAX] = "";
    const char *open_json = "{\"target_worker\":{\"model\":\"/m/t\"},\"gateway\":{\"listen\":\"0.0.0.0:8000\"}}";
    assert_int_equal(load(&cfg, open_json, err), 0);
    assert_int_equal(proc_config_finalize(&cfg, PROC_CONFIG_GATEWAY, err), ERR_INVALID_ARG);
    assert_non_null(strstr(err, "gateway.listen"));
    assert_non_null(strstr(err, "gateway.api_key"));
    assert_non_null(strstr(err, "gateway.allow_unauthenticated"));
    assert_int_equal(load(&cfg, open_json, err), 0);
    assert_int_equal(proc_config_set(&cfg, "gateway.listen", "192.0.2.7:8000", err), 0);
    assert_int_equal(proc_config_finalize(&cfg, PROC_CONFIG_GATEWAY, err), ERR_INVALID_ARG);

    assert_int_equal(load(&cfg, open_json, err), 0);
    assert_int_equal(proc_config_set(&cfg, "gateway.allow_unauthenticated", "1", err), 0);
    assert_int_equal(proc_config_finalize(&cfg, PROC_CONFIG_GATEWAY, err), 0);
    assert_int_equal(load(&cfg, open_json, err), 0);
    assert_int_equal(proc_config_set(&cfg, "gateway.api_key_env", "GW_KEY", err), 0);
    assert_int_equal(proc_config_finalize(&cfg, PROC_CONFIG_GATEWAY, err), 0);
    assert_int_equal(load(&cfg, open_json, err), 0);
    assert_int_equal(proc_config_set(&cfg, "gateway.api_key", "sk-1", err), 0);
    assert_int_equal(proc_config_finalize(&cfg, PROC_CONFIG_GATEWAY, err), 0);
    /* loopback needs nothing */
    assert_int_equal(load(&cfg, "{\"target_worker\":{\"model\":\"/m/t\"},\"gateway\":{\"listen\":\"127.0.0.2:8000\"}}",
                          err),
                     0);
    assert_int_equal(proc_config_finalize(&cfg, PROC_CONFIG_GATEWAY, err), 0);

    assert_int_equal(load(&cfg, "{\"target_worker\":{\"model\":\"/m/t\"},\"gateway\":{\"metrics_require_key\":1}}",
                          err),
                     0);
    assert_int_equal(proc_config_finalize(&cfg, PROC_CONFIG_GATEWAY, err), ERR_INVALID_ARG);
    assert_non_null(strstr(err, "gateway.metrics_require_key"));
    assert_int_equal(load(&cfg, "{\"gateway\":{\"allow_unauthenticated\":2}}", err), ERR_INVALID_ARG);
    assert_non_null(strstr(err, "gateway.allow_unauthenticated"));
}

/* "pairs": each process sees its own pair's overrides over the worker
 * sections (whatever the order of the keys), every pair's keys are
 * checked in every process, and --pair must name a listed pair. */
static void test_proc_config_pairs_override_per_worker(void **state)
{
    (void)state;
    struct proc_config cfg;
    char err[ERR_MSG_MAX] = "";
    const char *json = "{\"pairs\": [{\"target_worker\": {\"device\": 0}, \"draft_worker\": {\"device\": 1}},"
                       "           {\"target_worker\": {\"device\": \"2\", \"threads\": 3}}],"
                       " \"target_worker\": {\"model\": \"/t\", \"backend\": \"cuda\", \"threads\": 1},"
                       " \"draft_worker\": {\"model\": \"/d\", \"device\": 7}}";
    assert_int_equal(load(&cfg, json, err), 0);
    assert_int_equal(cfg.n_pairs, 2);
    assert_string_equal(cfg.target_worker.device, "0");
    assert_string_equal(cfg.draft_worker.device, "1");
    assert_int_equal(cfg.target_worker.threads, 1);
    proc_config_defaults(&cfg);
    cfg.pair = 1;
    assert_int_equal(proc_config_load_json(&cfg, json, "test.json", err), 0);
    assert_string_equal(cfg.target_worker.device, "2");
    assert_int_equal(cfg.target_worker.threads, 3);
    assert_string_equal(cfg.target_worker.model, "/t");
    assert_string_equal(cfg.target_worker.backend, "cuda");
    assert_string_equal(cfg.draft_worker.device, "7"); /* pair 1 did not override it */
    /* without "pairs": one */
    assert_int_equal(load(&cfg, "{\"target_worker\": {\"model\": \"/t\"}}", err), 0);
    assert_int_equal(cfg.n_pairs, 1);

    /* another pair's mistake is everyone's */
    assert_int_equal(load(&cfg, "{\"pairs\": [{}, {\"target_worker\": {\"devise\": 1}}]}", err), ERR_INVALID_ARG);
    assert_string_equal(err, "test.json: pairs[1].target_worker.devise: unknown key (did you mean \"device\"?)");
    assert_int_equal(load(&cfg, "{\"pairs\": [{}, {\"coordinator\": {}}]}", err), ERR_INVALID_ARG);
    assert_non_null(strstr(err, "pairs[1].coordinator: unknown key"));
    assert_int_equal(load(&cfg, "{\"pairs\": [{\"target_worker\": {\"threads\": \"x\"}}]}", err), ERR_INVALID_ARG);
    assert_non_null(strstr(err, "pairs[0].target_worker.threads: expected an integer"));
    assert_int_equal(load(&cfg, "{\"pairs\": []}", err), ERR_INVALID_ARG);
    assert_non_null(strstr(err, "pairs: expected an array of 1..8 objects"));
    assert_int_equal(load(&cfg, "{\"pairs\": [{},{},{},{},{},{},{},{},{}]}", err), ERR_INVALID_ARG);
    assert_int_equal(load(&cfg, "{\"pairs\": {}}", err), ERR_INVALID_ARG);
    assert_int_equal(load(&cfg, "{\"pairs\": [1]}", err), ERR_INVALID_ARG);
    assert_non_null(strstr(err, "pairs[0]: expected an object, got number"));

    /* --pair is read before the file, wherever it is */
    char dir[] = "/tmp/tandem-test-pairs-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[256];
    snprintf(path, sizeof path, "%s/c.json", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(json, f);
    assert_int_equal(fclose(f), 0);
    char *argv[] = {"prog", "--config", path, "--pair", "1", NULL};
    assert_int_equal(proc_config_parse_args(&cfg, 5, argv, "target_worker", PROC_CONFIG_TARGET, err), 0);
    assert_int_equal(cfg.pair, 1);
    assert_string_equal(cfg.target_worker.device, "2");
    char *argv2[] = {"prog", "--pair=2", "--config", path, NULL};
    assert_int_equal(proc_config_parse_args(&cfg, 4, argv2, "target_worker", PROC_CONFIG_TARGET, err),
                     ERR_INVALID_ARG);
    assert_non_null(strstr(err, "pair: 2, but the config has 2 pairs"));
    char *argv3[] = {"prog", "--pair", "x", NULL};
    assert_int_equal(proc_config_parse_args(&cfg, 3, argv3, "target_worker", PROC_CONFIG_TARGET, err),
                     ERR_INVALID_ARG);
    assert_non_null(strstr(err, "--pair: expected an index in 0..7"));
    assert_int_equal(unlink(path), 0);
    assert_int_equal(rmdir(dir), 0);
}

/* CURVE on the worker endpoint: the coordinator's two keys go together, so
 * do a worker's two; a non-local worker endpoint still needs the
 * operator's external_workers. */
static void test_proc_config_worker_curve_keys_go_in_pairs(void **state)
{
    (void)state;
    struct proc_config cfg;
    char err[ERR_MSG_MAX] = "";
    const unsigned all = PROC_CONFIG_COORDINATOR | PROC_CONFIG_DRAFT | PROC_CONFIG_TARGET;
    assert_int_equal(load(&cfg, "{\"coordinator\": {\"worker_endpoint\": \"tcp://*:5601\", "
                                "\"worker_curve_keys_file\": \"/k/workers\"}, "
                                "\"draft_worker\": {\"model\": \"/d\"}, \"target_worker\": {\"model\": \"/t\"}}",
                          err), 0);
    assert_int_equal(proc_config_finalize(&cfg, all, err), ERR_INVALID_ARG);
    assert_non_null(strstr(err, "external_workers"));
    cfg.coordinator.external_workers = 1;
    assert_int_equal(proc_config_finalize(&cfg, all, err), ERR_INVALID_ARG);
    assert_non_null(strstr(err, "coordinator.worker_curve_keys_file: needs coordinator.worker_curve_secret_key_file"));
    snprintf(cfg.coordinator.worker_curve_secret_key_file, sizeof cfg.coordinator.worker_curve_secret_key_file,
             "/k/server.key");
    assert_int_equal(proc_config_finalize(&cfg, all, err), 0);
    snprintf(cfg.draft_worker.curve_secret_key_file, sizeof cfg.draft_worker.curve_secret_key_file, "/k/d.key");
    assert_int_equal(proc_config_finalize(&cfg, all, err), ERR_INVALID_ARG);
    assert_non_null(strstr(err, "draft_worker.curve_secret_key_file: needs draft_worker.coordinator_curve_public_key_file"));
    snprintf(cfg.draft_worker.coordinator_curve_public_key_file,
             sizeof cfg.draft_worker.coordinator_curve_public_key_file, "/k/server.pub");
    assert_int_equal(proc_config_finalize(&cfg, all, err), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_proc_config_defaults_match_the_brief),
        cmocka_unit_test(test_proc_config_file_values_are_loaded),
        cmocka_unit_test(test_proc_config_missing_model_names_the_key),
        cmocka_unit_test(test_proc_config_wrong_type_names_key_and_type),
        cmocka_unit_test(test_proc_config_boolean_keys_take_json_booleans),
        cmocka_unit_test(test_proc_config_unknown_keys_are_rejected),
        cmocka_unit_test(test_proc_config_enum_and_range_errors_name_the_key),
        cmocka_unit_test(test_proc_config_bad_endpoints_are_rejected),
        cmocka_unit_test(test_proc_config_set_parses_and_overrides),
        cmocka_unit_test(test_proc_config_parse_args_file_then_flags),
        cmocka_unit_test(test_proc_config_pairs_override_per_worker),
        cmocka_unit_test(test_proc_config_worker_curve_keys_go_in_pairs),
        cmocka_unit_test(test_proc_config_malformed_json_is_a_format_error),
        cmocka_unit_test(test_proc_config_reachable_endpoints_need_an_explicit_choice),
        cmocka_unit_test(test_proc_config_deploy_examples_are_valid),
        cmocka_unit_test(test_proc_config_run_dir_is_private),
        cmocka_unit_test(test_proc_config_gateway_section_defaults_and_derived_keys),
        cmocka_unit_test(test_proc_config_gateway_served_name_of_hf_snapshot),
        cmocka_unit_test(test_proc_config_draft_configured_by_its_section),
        cmocka_unit_test(test_proc_config_gateway_to_a_curve_coordinator_needs_its_keys),
        cmocka_unit_test(test_proc_config_gateway_body_limit_fits_the_coordinator),
        cmocka_unit_test(test_proc_config_gateway_exposure_needs_a_key_or_a_choice),
        cmocka_unit_test(test_proc_config_sampler_follows_the_backend),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
