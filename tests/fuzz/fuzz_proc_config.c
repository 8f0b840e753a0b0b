/* fuzz_proc_config.c: the processes' JSON config file from fuzz bytes:
 * proc_config_defaults, proc_config_load_json (the text is copied to a
 * NUL-terminated buffer, as proc_config_load_file reads it), then
 * proc_config_finalize for each process's sections, as each main() does. */
#include "fuzz_common.h"

#include "error.h"
#include "proc_config.h"

static void check_strings(const struct proc_config *c)
{
    /* Every string field stays NUL-terminated inside its array. */
    if (!memchr(c->instance, 0, sizeof c->instance) ||
        !memchr(c->coordinator.client_endpoint, 0, sizeof c->coordinator.client_endpoint) ||
        !memchr(c->coordinator.worker_endpoint, 0, sizeof c->coordinator.worker_endpoint) ||
        !memchr(c->coordinator.tokenizer, 0, sizeof c->coordinator.tokenizer) ||
        !memchr(c->coordinator.spec_mode, 0, sizeof c->coordinator.spec_mode) ||
        !memchr(c->coordinator.log_level, 0, sizeof c->coordinator.log_level))
        abort();
    const struct worker_config *w[2] = {&c->draft_worker, &c->target_worker};
    for (int i = 0; i < 2; i++)
        if (!memchr(w[i]->model, 0, sizeof w[i]->model) ||
            !memchr(w[i]->backend, 0, sizeof w[i]->backend) ||
            !memchr(w[i]->device, 0, sizeof w[i]->device) ||
            !memchr(w[i]->coordinator_endpoint, 0, sizeof w[i]->coordinator_endpoint) ||
            !memchr(w[i]->log_level, 0, sizeof w[i]->log_level))
            abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = malloc(size + 1);
    if (!text)
        return 0;
    memcpy(text, data, size);
    text[size] = '\0';
    char err[ERR_MSG_MAX];
    static const unsigned masks[] = {PROC_CONFIG_COORDINATOR, PROC_CONFIG_DRAFT,
                                     PROC_CONFIG_TARGET,
                                     PROC_CONFIG_COORDINATOR | PROC_CONFIG_DRAFT |
                                         PROC_CONFIG_TARGET};
    struct proc_config cfg;
    proc_config_defaults(&cfg);
    if (proc_config_load_json(&cfg, text, "fuzz.json", err) == 0) {
        check_strings(&cfg);
        for (size_t i = 0; i < sizeof masks / sizeof masks[0]; i++) {
            struct proc_config c = cfg;
            if (proc_config_finalize(&c, masks[i], err) == 0)
                check_strings(&c);
        }
    }
    free(text);
    return 0;
}
