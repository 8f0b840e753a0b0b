/* coord_fakes.c: see coord_fakes.h. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "coord_fakes.h"
#include "error.h"
#include "replies.h"
#include "scheduler.h"
#include "worker_send.h"

static const char *who(int role)
{
    return role == COORD_FAKES_TO_IDENTITY ? "unregistered" : coord_role_name((enum worker_role)role);
}



struct sent sent_log[COORD_FAKES_LOG_MAX];
int n_sent, next_sent;

struct protocol_msg over_the_wire(cJSON *h, const struct protocol_frame *frame)
{
    struct protocol_msg m;
    memset(&m, 0, sizeof m);
    char *text = cJSON_PrintUnformatted(h);
    assert_non_null(text);
    m.header = cJSON_Parse(text);
    free(text);
    assert_non_null(m.header);
    m.type = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(m.header, "type"));
    if (frame && frame->size_bytes > 0) {
        m.frame_data[0] = malloc(frame->size_bytes);
        assert_non_null(m.frame_data[0]);
        memcpy(m.frame_data[0], frame->data, frame->size_bytes);
        m.frame_size_bytes[0] = frame->size_bytes;
        m.n_frames = 1;
    }
    return m;
}

int worker_send_frames(struct coordinator *c, int pair, enum worker_role role, cJSON *hdr,
                       const struct protocol_frame *frames, int n_frames)
{
    (void)c;
    assert_true(n_sent < COORD_FAKES_LOG_MAX);
    sent_log[n_sent].role = role;
    sent_log[n_sent].pair = pair;
    sent_log[n_sent].msg = over_the_wire(hdr, n_frames > 0 ? &frames[0] : NULL);
    for (int i = 1; i < n_frames && i < PROTOCOL_MAX_FRAMES; i++) {
        struct protocol_msg *m = &sent_log[n_sent].msg;
        m->frame_data[i] = malloc(frames[i].size_bytes ? frames[i].size_bytes : 1);
        assert_non_null(m->frame_data[i]);
        memcpy(m->frame_data[i], frames[i].data, frames[i].size_bytes);
        m->frame_size_bytes[i] = frames[i].size_bytes;
        m->n_frames = i + 1;
    }
    n_sent++;
    cJSON_Delete(hdr);
    return 0;
}

int worker_send(struct coordinator *c, int pair, enum worker_role role, cJSON *hdr,
                const struct protocol_frame *frame)
{
    return worker_send_frames(c, pair, role, hdr, frame, frame ? 1 : 0);
}

int worker_send_to_identity(struct coordinator *c, const uint8_t *identity, size_t identity_size, cJSON *hdr)
{
    (void)c;
    assert_true(n_sent < COORD_FAKES_LOG_MAX);
    assert_true(identity_size <= sizeof sent_log[n_sent].identity);
    sent_log[n_sent].role = COORD_FAKES_TO_IDENTITY;
    sent_log[n_sent].pair = -1;
    memcpy(sent_log[n_sent].identity, identity, identity_size);
    sent_log[n_sent].identity_size = identity_size;
    sent_log[n_sent].msg = over_the_wire(hdr, NULL);
    n_sent++;
    cJSON_Delete(hdr);
    return 0;
}

struct replies rep;

enum reply_sent replies_send(struct coordinator *c, const uint8_t *identity, size_t identity_size,
                             const cJSON *msg)
{
    (void)c, (void)identity, (void)identity_size;
    rep.sends++;
    char *text = cJSON_PrintUnformatted(msg);
    assert_non_null(text);
    snprintf(rep.last_sent, sizeof rep.last_sent, "%s", text);
    free(text);
    return REPLY_SENT;
}

void replies_error(struct coordinator *c, const uint8_t *identity, size_t identity_size,
                   const char *id, enum metrics_error code, const char *message)
{
    (void)c, (void)identity, (void)identity_size;
    rep.errors++;
    rep.last_error = code;
    snprintf(rep.last_error_id, sizeof rep.last_error_id, "%s", id);
    snprintf(rep.last_error_message, sizeof rep.last_error_message, "%s", message);
}

void replies_error_of(struct coordinator *c, const struct seq *s, enum metrics_error code, const char *message)
{
    replies_error(c, s->client, s->client_size, s->id, code, message);
}

void replies_stream(struct coordinator *c, struct seq *s, bool final)
{
    (void)c, (void)final;
    rep.streams++;
    if (rep.queue_full)
        s->replies_stalled = true; /* as replies.c marks a token event a full queue refused */
}

void replies_done(struct coordinator *c, struct seq *s, enum metrics_finish reason, double t)
{
    (void)c, (void)t;
    rep.dones++;
    rep.last_finish = reason;
    rep.n_done_ids = s->n_hist - s->n_prompt;
    memcpy(rep.done_ids, s->hist + s->n_prompt, (size_t)rep.n_done_ids * sizeof(int32_t));
}

void log_clear(void)
{
    for (int i = 0; i < n_sent; i++)
        protocol_msg_free(&sent_log[i].msg);
    n_sent = next_sent = 0;
    memset(&rep, 0, sizeof rep);
}

struct seq *request_from(struct coordinator *c, const int32_t *prompt, int n_prompt, int max_tokens, int k_fixed,
                         enum request_draft draft)
{
    struct seq *s = NULL;
    for (int i = 0; i < c->n_seqs && !s; i++)
        if (c->seqs[i].state == SEQ_FREE)
            s = &c->seqs[i];
    assert_non_null(s);
    static uint64_t next_req = 1;
    char err[ERR_MSG_MAX];
    s->req = next_req++;
    snprintf(s->id, sizeof s->id, "r%llu", (unsigned long long)s->req);
    s->cap_hist = n_prompt + max_tokens + SPECULATE_K_MAX + 2;
    s->hist = malloc((size_t)s->cap_hist * sizeof(int32_t));
    assert_non_null(s->hist);
    memcpy(s->hist, prompt, (size_t)n_prompt * sizeof(int32_t));
    s->n_hist = s->n_prompt = n_prompt;
    s->max_tokens = max_tokens;
    sampling_params_default(&s->sp);
    s->sp.temperature = 0.0f;
    s->mode = SPECULATE_MODE_SAMPLED;
    s->draft = draft;
    assert_int_equal(output_create(&s->out, NULL, NULL, 0, err), 0);
    adaptive_k_init_wall(&s->kc, k_fixed, c->cfg.coordinator.spec_k_max);
    s->t_arrival_ms = coord_now_ms();
    scheduler_enqueue(c, s);
    return s;
}

struct protocol_msg *next_command(int role, const char *type)
{
    for (; next_sent < n_sent; next_sent++) {
        struct sent *e = &sent_log[next_sent];
        if (e->role == role && strcmp(e->msg.type, type) == 0)
            return &sent_log[next_sent++].msg;
        fail_msg("expected %s to the %s worker, got %s to %s", type, who(role), e->msg.type, who(e->role));
    }
    fail_msg("expected %s to the %s worker, nothing more was sent", type, who(role));
    return NULL;
}

void no_more_commands(void)
{
    if (next_sent < n_sent)
        fail_msg("unexpected %s to the %s worker", sent_log[next_sent].msg.type, who(sent_log[next_sent].role));
}


int coord_test_init(struct coordinator *c, int n_seqs)
{
    memset(c, 0, sizeof *c);
    proc_config_defaults(&c->cfg);
    c->cfg.coordinator.max_concurrency = n_seqs;
    c->seqs = calloc((size_t)n_seqs, sizeof *c->seqs);
    if (!c->seqs)
        return -1;
    c->n_seqs = n_seqs;
    for (int i = 0; i < n_seqs; i++)
        c->seqs[i].slot = i;
    c->busy_since_ms = -1;
    c->n_pairs = 1;
    for (int p = 0; p < COORD_PAIRS_MAX; p++) {
        c->pair[p].index = p;
        c->pair[p].target_idle_since_ms = -1;
        for (int r = 0; r < 2; r++)
            c->pair[p].worker[r].lane_fd = -1;
    }
    c->lane_listen_fd = -1;
    metrics_init(&c->metrics);
    ngram_params_default(&c->ngram);
    c->default_draft = REQUEST_DRAFT_MODEL;
    log_clear();
    return 0;
}

void coord_test_fini(struct coordinator *c)
{
    for (int i = 0; i < c->n_seqs; i++)
        if (c->seqs[i].state != SEQ_FREE)
            scheduler_seq_reset(&c->seqs[i]);
    free(c->seqs);
    for (int p = 0; p < COORD_PAIRS_MAX; p++)
        for (int r = 0; r < 2; r++)
        {
            cJSON_Delete(c->pair[p].worker[r].shm);
            cJSON_Delete(c->pair[p].worker[r].shm_frames);
        }
    suffix_cache_destroy(c->suffix);
    log_clear();
}

struct seq *request(struct coordinator *c, const int32_t *prompt, int n_prompt, int max_tokens, int k_fixed)
{
    return request_from(c, prompt, n_prompt, max_tokens, k_fixed, REQUEST_DRAFT_MODEL);
}
