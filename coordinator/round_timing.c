/* round_timing.c: see round_timing.h. Every time is coord_now_ms's clock. */
#include "round_timing.h"

#include "adaptive_k.h"
#include "logging.h"
#include "speculate.h"
#include "worker_msg.h"

/* Decay of the call-cost sums: costs belong to the hardware and the models,
 * so they are remembered long (as adaptive_k's own cost fit). */
#define CALL_FIT_DECAY 0.99

void round_timing_draft_wait(struct coordinator *c, const struct seq *s, double until_ms)
{
    if (s->round.times.start_ms <= 0)
        return;
    const double wait = until_ms - s->round.times.start_ms;
    c->metrics.draft_wait_rounds++;
    c->metrics.draft_wait_ms_total += wait;
    if (wait > c->metrics.draft_wait_ms_max)
        c->metrics.draft_wait_ms_max = wait;
}

void round_timing_verify_sent(struct coordinator *c, struct seq *s, int k, bool beside_draft)
{
    s->round.times.verify_sent_ms = coord_now_ms();
    /* a plain round's wall is the request's own only with no unused
     * pre-draft still being made beside it */
    s->round.times.plain_alone = s->round.predraft.state != PREDRAFT_ABANDONED;
    /* beside its draft, the round's wait ends with draft_ready */
    if (k > 0 && !beside_draft)
        round_timing_draft_wait(c, s, s->round.times.verify_sent_ms);
    struct pair *p = coord_pair_of(c, s);
    if (p->target_outstanding == 0 && p->target_idle_since_ms >= 0) {
        double gap = s->round.times.verify_sent_ms - p->target_idle_since_ms;
        c->metrics.target_gap_samples++;
        c->metrics.target_gap_ms_total += gap;
        if (gap > c->metrics.target_gap_ms_max)
            c->metrics.target_gap_ms_max = gap;
    }
    p->target_idle_since_ms = -1;
}

void round_timing_draft_sent(struct seq *s, bool with_prefill)
{
    s->round.times.draft_sent_ms = coord_now_ms();
    s->round.times.predrafted = s->round.draft.predraft_k > 0;
    s->round.times.with_prefill = with_prefill;
}

void round_timing_prefill_sent(struct coordinator *c, struct seq *s)
{
    s->round.times.verify_sent_ms = coord_now_ms();
    coord_pair_of(c, s)->target_idle_since_ms = -1;
}

void round_timing_draft_compute(struct coordinator *c, struct seq *s, double draft_ms)
{
    if (draft_ms >= 0) {
        c->metrics.draft_ms_total += draft_ms;
        s->draft_ms += draft_ms;
    }
}

void round_timing_draft_ready(struct seq *s, int k, double draft_ms)
{
    s->round.times.draft_ready_ms = coord_now_ms();
    s->round.times.last_draft_ms = draft_ms >= 0 ? draft_ms : s->round.times.draft_ready_ms - s->round.times.draft_sent_ms;
    s->round.times.last_draft_raw_ms = s->round.times.last_draft_ms;
    /* Catching up on tokens the draft skipped (rounds at K = 0, a restart)
     * is a one-off: the K controller wants the cost of drafting itself. The
     * feed every drafting round brings (SPECULATE_ROUND_FEED_MAX) is part
     * of that cost. */
    if (s->round.draft.n_feed > SPECULATE_ROUND_FEED_MAX)
        s->round.times.last_draft_ms *= (double)k / (double)(k + s->round.draft.n_feed - SPECULATE_ROUND_FEED_MAX);
}

void round_timing_predraft_used(struct seq *s)
{
    /* a pre-draft made during the verification cost the target nothing */
    const double now = coord_now_ms();
    s->round.times.last_draft_ms = s->round.times.verify_done_ms > 0 && now > s->round.times.verify_done_ms ? now - s->round.times.verify_done_ms : 0.0;
    s->round.times.last_draft_raw_ms = s->round.times.last_draft_ms;
    s->round.times.draft_ready_ms = -1.0;
    s->round.times.with_prefill = false;
}

/* A target call seen for the first time: counted, and its cost fitted as
 * base + per_row * rows over the calls so far (least squares on decayed
 * sums; until the row counts have varied, every row is assumed to cost as
 * much as the call's base spread over its rows). */
static void note_target_call(struct coordinator *c, struct pair *p, const struct worker_msg_verify_done *m)
{
    metrics_note_target_call(&c->metrics, m->call_seqs, m->call_rows, m->call_ms);
    p->target_calls++;
    if (m->call_ms <= 0 || m->call_rows < 1)
        return;
    const double x = m->call_rows, y = m->call_ms;
    p->call_fit_w = p->call_fit_w * CALL_FIT_DECAY + 1;
    p->call_fit_x = p->call_fit_x * CALL_FIT_DECAY + x;
    p->call_fit_xx = p->call_fit_xx * CALL_FIT_DECAY + x * x;
    p->call_fit_y = p->call_fit_y * CALL_FIT_DECAY + y;
    p->call_fit_xy = p->call_fit_xy * CALL_FIT_DECAY + x * y;
    const double mx = p->call_fit_x / p->call_fit_w, my = p->call_fit_y / p->call_fit_w;
    const double var = p->call_fit_xx / p->call_fit_w - mx * mx;
    const double slope = var > 0.25 ? (p->call_fit_xy / p->call_fit_w - mx * my) / var : -1;
    if (slope >= 0 && my - slope * mx > 0) {
        p->call_ms_per_row = slope;
        p->call_ms_base = my - slope * mx;
    } else {
        p->call_ms_per_row = 0;
        p->call_ms_base = 0; /* not measured: adaptive K ignores the load */
    }
}

/* The target's side of a verification's reply: its call, idle and compute
 * time. Returns the round's wall time (< 0 for the prefill's reply). */
static double note_verify_reply(struct coordinator *c, struct seq *s, const struct worker_msg_verify_done *m,
                                bool prefill, double now)
{
    const double round_wall_ms = !prefill && s->round.times.start_ms > 0 ? now - s->round.times.start_ms : -1.0;
    s->round.times.verify_done_ms = now;
    s->round.times.start_ms = now;
    /* one call answers several sequences' rounds: each call is fitted once */
    struct pair *p = coord_pair_of(c, s);
    if (m->call > p->last_target_call) {
        p->last_target_call = m->call;
        note_target_call(c, p, m);
    }
    struct metrics *mt = &c->metrics;
    if (m->idle_ms >= 0) {
        mt->target_idle_samples++;
        mt->target_idle_ms_total += m->idle_ms;
        if (m->idle_ms > mt->target_idle_ms_max)
            mt->target_idle_ms_max = m->idle_ms;
    }
    mt->verify_ms_total += m->verify_ms;
    s->verify_ms += m->verify_ms;
    return round_wall_ms;
}

/* Teaches s's K controller the round its reply m just ended (a round of
 * the draft model, in the state that awaited the reply). Beside its draft,
 * the verification can come back before draft_ready (two sockets, no order
 * between them): the round's draft cost is then unknown, and the late
 * draft_ready is dropped as stale. */
static void learn(struct coordinator *c, struct seq *s, const struct worker_msg_verify_done *m,
                  double round_wall_ms, double now)
{
    const int k = s->round.verify.k, n_acc = m->n_accepted, n_tok = m->n_tokens;
    const bool beside = s->round.state == ROUND_VERIFY_BESIDE_DRAFT;
    const bool draft_unknown = beside && s->round.verify.beside != BESIDE_DRAFT_IN;
    if (draft_unknown)
        round_timing_draft_wait(c, s, now);
    /* Every round teaches the controller, plain ones included (they are
     * what speculation is compared with). Its wall time counts, at the load
     * level the round was decided under (the controller keeps each level's
     * figures apart), with catching-up on skipped tokens left out (a
     * one-off, as in last_draft_ms), and for a plain round, no unused
     * pre-draft still running beside it. */
    double wall_ms = round_wall_ms;
    if (k > 0 && s->round.times.last_draft_raw_ms > s->round.times.last_draft_ms)
        wall_ms -= s->round.times.last_draft_raw_ms - s->round.times.last_draft_ms;
    if (k == 0 && !s->round.times.plain_alone)
        wall_ms = -1.0;
    /* a draft that shared its forward calls with the prompt's prefill
     * (the first round, admitted while the draft still prefills) says
     * nothing of drafting's cost */
    double draft_ms = k == 0 ? 0.0 : s->round.times.with_prefill || draft_unknown ? -1.0 : s->round.times.last_draft_ms;
    if (k > 0 && (s->round.times.with_prefill || draft_unknown))
        wall_ms = -1.0;
    adaptive_k_update_wall(&s->kc, k, n_acc, draft_ms, m->verify_ms, wall_ms);
    if (k > 0)
        adaptive_k_note_predraft(&s->kc, s->round.times.predrafted, n_tok, wall_ms);
    LOG_DEBUG("round \"%s\" #%d: k %d accepted %d %s; wall %.2f ms: draft wait %.2f (draft compute %.2f), "
              "verify sent->done %.2f (target compute %.2f, idle %.2f); controller: a %.2f, draft %.2f/token, "
              "verify %.2f + %.2f/row, plain wall %.2f, drafting excess %.2f (load level %d), pre-drafts %s",
              s->id, s->rounds, k, n_acc, k == 0 ? "plain" : s->round.times.draft_ready_ms < 0 ? "pre-draft" : "fresh",
              round_wall_ms,
              k > 0 ? (beside && !draft_unknown ? s->round.times.draft_ready_ms : s->round.times.verify_sent_ms) - (now - round_wall_ms)
                    : 0.0,
              k > 0 ? s->round.times.last_draft_raw_ms : 0.0, now - s->round.times.verify_sent_ms, m->verify_ms, m->idle_ms,
              s->kc.accept_rate, s->kc.draft_ms_per_token, s->kc.verify_ms_base, s->kc.verify_ms_per_row,
              adaptive_k_level_costs(&s->kc)->plain_ms, adaptive_k_level_costs(&s->kc)->extra_ms, s->kc.load_level,
              coord_pair_of(c, s)->cores_shared ? "off (shared cores)" : s->kc.predraft_on ? "on" : "off");
}

static void count_round(struct coordinator *c, struct seq *s, int k, int n_acc)
{
    struct metrics *mt = &c->metrics;
    s->rounds++;
    mt->verify_rounds_total++;
    if (k == 0)
        return;
    s->drafted += k;
    s->accepted += n_acc;
    mt->num_drafts_total++;
    mt->num_draft_tokens_total += (uint64_t)k;
    mt->num_accepted_tokens_total += (uint64_t)n_acc;
    for (int i = 0; i < n_acc && i < METRICS_POS_MAX; i++)
        mt->accepted_per_pos[i]++;
    for (int i = 0; i < n_acc && i < SPECULATE_K_MAX; i++)
        s->accepted_at[i]++;
    if (s->round.verify.tree) {
        s->tree_rounds++;
        s->tree_nodes += k;
        s->tree_accepted += n_acc;
        mt->tree_rounds_total++;
        mt->tree_nodes_total += (uint64_t)k;
        mt->tree_accepted_tokens_total += (uint64_t)n_acc;
    }
    if (s->round.verify.source == REQUEST_DRAFT_NGRAM) {
        mt->ngram_drafts_total++;
        mt->ngram_draft_tokens_total += (uint64_t)k;
        mt->ngram_accepted_tokens_total += (uint64_t)n_acc;
    } else if (s->round.verify.source == REQUEST_DRAFT_SUFFIX) {
        mt->suffix_drafts_total++;
        mt->suffix_draft_tokens_total += (uint64_t)k;
        mt->suffix_accepted_tokens_total += (uint64_t)n_acc;
    }
}

void round_timing_verify_done(struct coordinator *c, struct seq *s, const struct worker_msg_verify_done *m,
                              double now)
{
    const enum round_state st = s->round.state;
    const double round_wall_ms = note_verify_reply(c, s, m, st == ROUND_PREFILLING, now);
    if (st == ROUND_PREFILLING)
        return;
    count_round(c, s, s->round.verify.k, m->n_accepted);
    /* the K controller prices the draft model's rounds (a matched source's
     * K is the cap: its drafts cost nothing to make) */
    if (s->round.verify.source == REQUEST_DRAFT_MODEL)
        learn(c, s, m, round_wall_ms, now);
    /* a matched round of a request that leaves trees to the coordinator
     * teaches the pair's tree choice, alone only (drafters_tree_budget) */
    const enum request_draft src = s->round.verify.source;
    struct pair *p = coord_pair_of(c, s);
    if (s->round.verify.k > 0 && (src == REQUEST_DRAFT_SUFFIX || src == REQUEST_DRAFT_NGRAM) &&
        s->spec_tree == REQUEST_SPEC_TREE_AUTO && p->n_active == 1)
        tree_choice_note(&p->trees, s->round.verify.tree, m->n_tokens, round_wall_ms);
}

void round_timing_step_sent(struct seq *s, double now)
{
    s->round.times.verify_sent_ms = now;
}
