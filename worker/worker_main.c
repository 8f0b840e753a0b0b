/* worker_main.c: the shared main() of the worker processes and the model
 * they hold (see worker_main.h).
 *
 * The stop flag is the one piece of process-wide state: a signal handler
 * can reach nothing else. It is only ever set to 1, by SIGTERM/SIGINT.
 */
#define _GNU_SOURCE /* sched_getaffinity */
#include "worker_main.h"

#include <errno.h>
#include <sched.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cpulist.h"
#include "error.h"
#include "logging.h"

static volatile sig_atomic_t worker_main_stop;

static void on_signal(int sig)
{
    (void)sig;
    worker_main_stop = 1;
}

static void usage(FILE *out, const char *name, const char *section)
{
    fprintf(out, "usage: tandem-%s-worker --config FILE [--key value]...\n"
                 "Keys of the %s section (other sections: --section.key value):\n",
            name, section);
    proc_config_print_usage(out, section);
}

int worker_main(int argc, char **argv, const struct worker_main_role *role)
{
    const bool draft = strcmp(role->name, "draft") == 0;
    const char *section = draft ? "draft_worker" : "target_worker";
    logging_set_tag(role->name);
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            usage(stdout, role->name, section);
            return 0;
        }
    char err[ERR_MSG_MAX] = "";
    struct proc_config cfg;
    if (proc_config_parse_args(&cfg, argc, argv, section,
                               draft ? PROC_CONFIG_DRAFT : PROC_CONFIG_TARGET, err) != 0) {
        LOG_ERROR("%s", err);
        return WORKER_MAIN_EXIT_CONFIG;
    }
    const struct worker_config *wc = draft ? &cfg.draft_worker : &cfg.target_worker;
    if (cfg.pair > 0) {
        /* pair N's workers: "target1", as the supervisor names them */
        char tag[32];
        snprintf(tag, sizeof tag, "%s%d", role->name, cfg.pair);
        logging_set_tag(tag);
    }
    logging_set_level((enum logging_level)logging_level_parse(wc->log_level));
    /* The default worker socket is in the instance's private directory: never
     * connect through one someone else planted. */
    if (proc_config_prepare_run_dir(&cfg, err) != 0) {
        LOG_ERROR("%s", err);
        return WORKER_MAIN_EXIT_CONFIG;
    }

    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGTERM, &sa, NULL) != 0 || sigaction(SIGINT, &sa, NULL) != 0 ||
        logging_reopen_on_sighup() != 0) {
        LOG_ERROR("sigaction failed");
        return 1;
    }
    signal(SIGPIPE, SIG_IGN);

    void *w = NULL;
    int rc = role->create(&w, &cfg, err);
    if (rc != 0) {
        LOG_ERROR("%s", err);
        /* A model that cannot load will not load on a restart either. */
        return rc == ERR_SYSTEM || rc == ERR_NOMEM ? 1 : WORKER_MAIN_EXIT_CONFIG;
    }
    rc = role->run(w, &worker_main_stop, err);
    role->destroy(w);
    if (rc != 0) {
        LOG_ERROR("%s", err);
        return rc == ERR_MISMATCH ? WORKER_MAIN_EXIT_CONFIG : 1;
    }
    LOG_INFO("stopped");
    return 0;
}

/* The kernel this process runs on: its boot id, else the host name. */
static bool read_host_id(char *out, size_t size)
{
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f) {
        bool ok = fgets(out, (int)size, f) != NULL;
        if (fclose(f) != 0)
            ok = false;
        out[strcspn(out, "\n")] = '\0';
        if (ok && out[0] != '\0')
            return true;
    }
    if (gethostname(out, size) != 0)
        return false;
    out[size - 1] = '\0';
    return out[0] != '\0';
}

/* Fills m->cpu for a CPU backend; leaves it absent (and says why in the
 * log) where the host or the affinity cannot be read. */
static void describe_cpu_use(struct worker_main_model *m, const char *backend)
{
    if (strcmp(backend, "cpu") != 0)
        return;
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof set, &set) != 0) {
        LOG_WARN("sched_getaffinity: %s; the coordinator will not know which cores this worker uses",
                 strerror(errno));
        return;
    }
    struct cpulist list;
    cpulist_clear(&list);
    for (int c = 0; c < CPU_SETSIZE && c < CPULIST_MAX; c++)
        if (CPU_ISSET(c, &set))
            cpulist_add(&list, c);
    char err[ERR_MSG_MAX];
    if (cpulist_format(&list, m->cpu_list, sizeof m->cpu_list, err) != 0) {
        LOG_WARN("%s; the coordinator will not know which cores this worker uses", err);
        return;
    }
    if (!read_host_id(m->cpu_host, sizeof m->cpu_host)) {
        LOG_WARN("neither the boot id nor the host name could be read; the coordinator will not "
                 "know which cores this worker uses");
        return;
    }
    m->cpu = (struct worker_msg_cpu){.present = true, .host = m->cpu_host,
                                     .threads = kern_cpu_threads(m->be), .cpus = m->cpu_list};
}

/* The facts of a context, loaded or borrowed. */
static void read_ctx_facts(struct worker_main_model *m)
{
    m->vocab = llama_model_config(m->model)->vocab_size;
    m->n_slots = llama_ctx_n_slots(m->ctx);
    struct llama_kv_stats kv;
    llama_ctx_kv_stats(m->ctx, &kv);
    m->kv_blocks = kv.n_blocks;
    m->kv_block_size = kv.block_size;
    m->max_seq_len = llama_ctx_max_seq_len(m->ctx);
}

int worker_main_model_load(struct worker_main_model *m, const struct proc_config *cfg,
                           const struct worker_config *wc, char *err)
{
    memset(m, 0, sizeof *m);
    int rc;
    if ((rc = kern_backend_create(&m->be, wc->backend, wc->device, wc->threads, err)))
        goto fail;
    enum quantize_mode quant;
    if ((rc = quantize_mode_parse(wc->quantize, &quant, err)) ||
        (rc = llama_model_load_quantized(&m->model, wc->model, m->be, quant, err)))
        goto fail;
    if (quant != QUANTIZE_NONE) {
        size_t file_bytes, held_bytes;
        llama_model_weight_memory(m->model, &file_bytes, &held_bytes);
        LOG_INFO("weights quantized %s: %.1f MiB in the files, %.1f MiB held", quantize_mode_name(quant),
                 (double)file_bytes / (1 << 20), (double)held_bytes / (1 << 20));
    }
    struct llama_ctx_params cp = {.n_slots = cfg->coordinator.max_concurrency,
                                  .max_seq_len = wc->max_seq_len, .max_rows = 0,
                                  .kv_block_size = LLAMA_DEFAULT_KV_BLOCK_SIZE,
                                  .prefix_cache = wc->prefix_cache != 0,
                                  .prefix_cache_tokens = wc->prefix_cache_tokens,
                                  .no_graphs = wc->cuda_graphs == 0};
    if (wc->kv_tokens > 0) {
        /* at least one full sequence, at most every slot full */
        long blocks = ((long)wc->kv_tokens + cp.kv_block_size - 1) / cp.kv_block_size;
        int max_seq = wc->max_seq_len > 0 ? wc->max_seq_len : LLAMA_DEFAULT_MAX_SEQ_LEN;
        long per_slot = ((long)max_seq + cp.kv_block_size - 1) / cp.kv_block_size;
        if (blocks < per_slot) {
            rc = error_set(err, ERR_INVALID_ARG,
                           "kv_tokens: %d cannot hold one sequence of max_seq_len %d", wc->kv_tokens,
                           max_seq);
            goto fail;
        }
        cp.kv_blocks = blocks < per_slot * cp.n_slots ? (int)blocks : 0;
    }
    if ((rc = llama_ctx_create(&m->ctx, m->model, &cp, err)))
        goto fail;
    read_ctx_facts(m);
    m->prefix_cache = cp.prefix_cache;
    describe_cpu_use(m, wc->backend);
    return 0;
fail:
    worker_main_model_free(m);
    return rc;
}

void worker_main_model_borrow(struct worker_main_model *m, struct kern_backend *be,
                              struct llama_model *model, struct llama_ctx *ctx)
{
    memset(m, 0, sizeof *m);
    m->be = be;
    m->model = model;
    m->ctx = ctx;
    m->borrowed = true;
    read_ctx_facts(m);
    describe_cpu_use(m, be->name);
}

struct worker_msg_prefix worker_main_prefix(const struct worker_main_model *m, int looked_up,
                                            int cached)
{
    if (!m->prefix_cache)
        return (struct worker_msg_prefix){.present = false};
    struct llama_kv_stats kv;
    llama_ctx_kv_stats(m->ctx, &kv);
    return (struct worker_msg_prefix){.present = true, .looked_up = looked_up, .cached = cached,
                                      .cached_blocks = kv.cached_blocks, .evictions = kv.evictions};
}

int worker_main_model_warm_up(struct worker_main_model *m, char *err)
{
    const double t0 = protocol_now_ms();
    const int rc = llama_ctx_warm_up(m->ctx, err);
    if (rc == 0) {
        struct llama_graph_stats g;
        llama_ctx_graph_stats(m->ctx, &g);
        if (g.steps)
            LOG_INFO("warm-up: %.0f ms; cuda graphs %s%s (%d shapes recorded)",
                     protocol_now_ms() - t0, g.graphs ? "on" : "off",
                     g.graphs ? "" : " (cuda_graphs 0, or a recording failed: see above)",
                     g.held);
        else
            LOG_INFO("warm-up: %.0f ms", protocol_now_ms() - t0);
    }
    return rc;
}

void worker_main_model_free(struct worker_main_model *m)
{
    if (m->borrowed) {
        memset(m, 0, sizeof *m);
        return;
    }
    llama_ctx_destroy(m->ctx);
    llama_model_destroy(m->model);
    kern_backend_destroy(m->be);
    memset(m, 0, sizeof *m);
}

void worker_fatal_set(struct worker_fatal *f, int rc, const char *err)
{
    if (f->rc == 0) {
        f->rc = rc;
        snprintf(f->err, sizeof f->err, "%s", err);
        LOG_ERROR("%s; stopping", err);
    }
    if (f->stop)
        *f->stop = 1;
}

int worker_fatal_result(const struct worker_fatal *f, int link_rc, char *err)
{
    if (link_rc == 0 && f->rc)
        return error_set(err, f->rc, "%s", f->err);
    return link_rc;
}

int worker_main_model_release(struct worker_main_model *m, struct worker_link *link,
                              const struct protocol_msg *msg, struct worker_msg_seq *seq_out)
{
    char err[ERR_MSG_MAX];
    struct worker_msg_limits lim = worker_main_model_limits(m, SPECULATE_K_MAX);
    int rc = worker_msg_release_decode(msg, &lim, seq_out, err);
    if (rc == 0)
        rc = llama_ctx_truncate(m->ctx, seq_out->slot, 0, err);
    if (rc)
        worker_link_send_error(link, PROTOCOL_RELEASE, seq_out, rc, err);
    return rc;
}

int worker_main_model_release_all(struct worker_main_model *m)
{
    int first = 0;
    for (int slot = 0; slot < m->n_slots; slot++) {
        char err[ERR_MSG_MAX];
        int rc = llama_ctx_truncate(m->ctx, slot, 0, err);
        if (rc) {
            LOG_ERROR("emptying slot %d: %s", slot, err);
            if (!first)
                first = rc;
        }
    }
    return first;
}

struct worker_msg_limits worker_main_model_limits(const struct worker_main_model *m, int k_max)
{
    return (struct worker_msg_limits){
        .n_slots = m->n_slots,
        .max_seq_len = m->max_seq_len,
        .k_max = k_max,
        .vocab_size = m->vocab,
    };
}
