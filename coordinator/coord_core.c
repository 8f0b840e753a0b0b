/* coord_core.c: see coord_core.h. */
#include "coord_core.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "constraint.h"
#include "error.h"
#include "logging.h"
#include "replies.h"
#include "scheduler.h"

/* The settings read once from the config; 0 or the config's error. */
static int take_settings(struct coordinator *c, char *err)
{
    const struct coordinator_config *cc = &c->cfg.coordinator;
    c->readiness_written = -1;
    c->max_message_bytes = (size_t)cc->max_message_bytes;
    c->default_mode = strcmp(cc->spec_mode, "point_mass") == 0 ? SPECULATE_MODE_POINT_MASS : SPECULATE_MODE_SAMPLED;
    ngram_params_default(&c->ngram);
    /* checked by the config's parser: one of the names */
    int rc = request_spec_tree_parse_text(cc->spec_tree, "coordinator.spec_tree", &c->default_spec_tree, err);
    return rc ? rc : request_draft_parse(cc->draft, "coordinator.draft", &c->default_draft, err);
}

/* Request numbers start somewhere new in each coordinator: the workers
 * outlive a coordinator, and the draft's buffer still holds halves
 * published under the last one's numbers. A verification sent beside its
 * draft waits for the half to hold its (req, round); from a restarted
 * coordinator counting from 1 again it would take an old half for its own
 * (seen under load with kill -9 of the coordinator: the draft then rewrote
 * the half under the verification). 48 bits: far below the 2^53 a JSON
 * number carries, far above the requests of one run. */
static void seed_numbers(struct coordinator *c)
{
    c->t_start_ms = coord_now_ms();
    c->rng_state = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32) ^ (uint64_t)(c->t_start_ms * 1000.0);
    c->next_req = ((c->rng_state ^ (c->rng_state >> 31)) * 0x9E3779B97F4A7C15ull) >> 16;
}

static int load_tokenizer(struct coordinator *c, char *err)
{
    char tk_err[ERR_MSG_MAX] = "";
    int rc = tokenizer_load(&c->tk, c->cfg.coordinator.tokenizer, tk_err);
    if (rc == ERR_IO || rc == ERR_NOT_FOUND) {
        LOG_WARN("coordinator.tokenizer: %s; only prompt_ids requests will be served", tk_err);
        c->tk = NULL;
        return 0;
    }
    return rc != 0 ? error_set(err, rc, "coordinator.tokenizer: %s", tk_err) : 0;
}

int coord_core_create(struct coordinator **out, const struct proc_config *cfg, char *err)
{
    *out = NULL;
    struct coordinator *c = calloc(1, sizeof(*c));
    if (c == NULL)
        return error_set(err, ERR_NOMEM, "coordinator: out of memory");
    c->cfg = *cfg;
    c->lane_listen_fd = -1;
    int rc = take_settings(c, err);
    if (rc != 0)
        goto fail;
    const struct coordinator_config *cc = &c->cfg.coordinator;
    if (cc->suffix_cache_mib > 0 &&
        (rc = suffix_cache_create(&c->suffix, (size_t)cc->suffix_cache_mib << 20, err)) != 0)
        goto fail;
    seed_numbers(c);
    metrics_init(&c->metrics);
    c->busy_since_ms = -1;
    c->n_pairs = c->cfg.n_pairs;
    for (int p = 0; p < COORD_PAIRS_MAX; p++) {
        c->pair[p].index = p;
        c->pair[p].target_idle_since_ms = -1;
        for (int r = 0; r < 2; r++)
            c->pair[p].worker[r].lane_fd = -1;
    }
    c->n_seqs = c->n_pairs * cc->max_concurrency + cc->max_queue;
    c->seqs = calloc((size_t)c->n_seqs, sizeof(*c->seqs));
    if (c->seqs == NULL) {
        rc = error_set(err, ERR_NOMEM, "coordinator: out of memory");
        goto fail;
    }
    if ((rc = load_tokenizer(c, err)) != 0)
        goto fail;
    *out = c;
    return 0;
fail:
    coord_core_destroy(c);
    return rc;
}

void coord_core_destroy(struct coordinator *c)
{
    if (c == NULL)
        return;
    replies_free_held(c);
    for (int i = 0; c->seqs != NULL && i < c->n_seqs; i++)
        scheduler_seq_reset(&c->seqs[i]);
    free(c->seqs);
    for (int p = 0; p < COORD_PAIRS_MAX; p++)
        for (int r = 0; r < 2; r++) {
            cJSON_Delete(c->pair[p].worker[r].shm);
            cJSON_Delete(c->pair[p].worker[r].shm_frames);
        }
    tokenizer_destroy(c->tk);
    suffix_cache_destroy(c->suffix);
    constraint_free(c);
    free(c);
}
