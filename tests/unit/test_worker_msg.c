/* test_worker_msg.c: the typed coordinator <-> worker messages. Each message
 * is encoded, printed and parsed back as it would cross the wire (header as
 * JSON text, the token frame copied), then decoded; the decoded struct must
 * equal the encoded one field by field. Out-of-range fields are refused with
 * the field named, and req/slot stay readable for the error reply. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "error.h"
#include "worker_msg.h"

static const struct worker_msg_limits limits = {
    .n_slots = 4, .max_seq_len = 64, .k_max = 8, .vocab_size = 100,
};

/* What protocol_recv would hand the receiver for header h (deleted here)
 * and an optional frame. */
static struct protocol_msg over_the_wire(cJSON *h, const struct protocol_frame *frame)
{
    assert_non_null(h);
    struct protocol_msg m;
    memset(&m, 0, sizeof m);
    char *text = cJSON_PrintUnformatted(h);
    assert_non_null(text);
    cJSON_Delete(h);
    m.header = cJSON_Parse(text);
    free(text);
    assert_non_null(m.header);
    m.type = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(m.header, "type"));
    if (frame) {
        m.frame_data[0] = malloc(frame->size_bytes + 1);
        assert_non_null(m.frame_data[0]);
        memcpy(m.frame_data[0], frame->data, frame->size_bytes);
        m.frame_size_bytes[0] = frame->size_bytes;
        m.n_frames = 1;
    }
    return m;
}

static struct worker_msg_sampling some_sampling(void)
{
    struct worker_msg_sampling s = {0}; /* no controls */
    sampling_params_default(&s.sp);
    s.sp.temperature = 0.75f;
    s.sp.top_k = 40;
    s.sp.top_p = 0.9f;
    s.sp.min_p = 0.05f;
    s.sp.seed = 9007199254740991ull; /* 2^53 - 1: still exact in JSON */
    s.mode = SPECULATE_MODE_POINT_MASS;
    return s;
}

static void assert_sampling_equal(const struct worker_msg_sampling *a,
                                  const struct worker_msg_sampling *b)
{
    assert_true(a->sp.temperature == b->sp.temperature);
    assert_int_equal(a->sp.top_k, b->sp.top_k);
    assert_true(a->sp.top_p == b->sp.top_p);
    assert_true(a->sp.min_p == b->sp.min_p);
    assert_true(a->sp.seed == b->sp.seed);
    assert_int_equal(a->mode, b->mode);
}

static void test_worker_msg_draft_round_trips(void **state)
{
    (void)state;
    int32_t feed[3] = {7, 8, 99};
    struct worker_msg_draft in = {
        .seq = {.req = 123456789012LL, .slot = 3}, .half = 1, .round = 4000000000LL,
        .keep_len = 17, .k = 8, .predraft_k = 7, .sampling = some_sampling(), .feed = feed,
        .n_feed = 3,
    };
    struct protocol_frame frame;
    struct protocol_msg m = over_the_wire(worker_msg_draft_encode(&in, &frame), &frame);
    assert_string_equal(m.type, PROTOCOL_DRAFT);
    struct worker_msg_draft out;
    char err[ERR_MSG_MAX] = "";
    assert_int_equal(worker_msg_draft_decode(&m, &limits, &out, err), 0);
    assert_int_equal(out.seq.req, in.seq.req);
    assert_int_equal(out.seq.slot, in.seq.slot);
    assert_int_equal(out.half, in.half);
    assert_int_equal(out.round, in.round);
    assert_int_equal(out.keep_len, in.keep_len);
    assert_int_equal(out.k, in.k);
    assert_int_equal(out.predraft_k, in.predraft_k);
    assert_sampling_equal(&out.sampling, &in.sampling);
    assert_int_equal(out.n_feed, 3);
    assert_memory_equal(out.feed, feed, sizeof feed);
    protocol_msg_free(&m);
}

static void test_worker_msg_verify_and_verify_done_round_trip(void **state)
{
    (void)state;
    int32_t feed[1] = {42};
    cJSON *shm = cJSON_CreateObject();
    cJSON_AddStringToObject(shm, "name", "/tandem-x-1-draft");
    struct worker_msg_verify in = {
        .call = {.seq = {.req = 5, .slot = 0}, .round = 9, .keep_len = 30, .sampling = some_sampling(),
                 .feed = feed, .n_feed = 1},
        .k = 4, .half = 1, .shm = shm,
    };
    struct protocol_frame frame;
    struct protocol_msg m = over_the_wire(worker_msg_verify_encode(&in, &frame), &frame);
    cJSON_Delete(shm);
    assert_string_equal(m.type, PROTOCOL_VERIFY);
    struct worker_msg_verify out;
    char err[ERR_MSG_MAX] = "";
    assert_int_equal(worker_msg_verify_decode(&m, &limits, &out, err), 0);
    assert_int_equal(out.call.seq.req, 5);
    assert_int_equal(out.call.round, 9);
    assert_int_equal(out.call.keep_len, 30);
    assert_int_equal(out.k, 4);
    assert_int_equal(out.half, 1);
    assert_sampling_equal(&out.call.sampling, &in.call.sampling);
    assert_non_null(out.shm);
    assert_string_equal(cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(out.shm, "name")),
                        "/tandem-x-1-draft");
    assert_int_equal(out.call.feed[0], 42);
    assert_false(out.call.logprobs.on);
    protocol_msg_free(&m);

    int32_t tokens[3] = {1, 2, 99};
    struct worker_msg_verify_done done = {
        .seq = {.req = 5, .slot = 0}, .round = 9, .n_accepted = 2, .verify_ms = 12.5,
        .idle_ms = -1, .draft_k = 4, .tokens = tokens, .n_tokens = 3,
        .prefix = {.present = true, .looked_up = 20, .cached = 16, .cached_blocks = 2, .evictions = 0},
    };
    m = over_the_wire(worker_msg_verify_done_encode(&done, &frame), &frame);
    struct worker_msg_verify_done dout;
    assert_int_equal(worker_msg_verify_done_decode(&m, &limits, &dout, err), 0);
    assert_true(dout.prefix.present);
    assert_int_equal(dout.prefix.cached, 16);
    assert_int_equal(dout.prefix.cached_blocks, 2);
    assert_int_equal(dout.n_accepted, 2);
    assert_true(dout.verify_ms == 12.5);
    assert_true(dout.idle_ms == -1); /* absent on the wire means unknown */
    assert_int_equal(dout.draft_k, 4);
    assert_int_equal(dout.n_tokens, 3);
    assert_memory_equal(dout.tokens, tokens, sizeof tokens);
    assert_false(dout.has_logprobs);
    protocol_msg_free(&m);
}

/* logprobs cross both ways exactly (floats printed with every digit), and
 * a malformed entry is a protocol error naming it. */
static void test_worker_msg_logprobs_round_trip(void **state)
{
    (void)state;
    char err[ERR_MSG_MAX] = "";
    int32_t feed[1] = {42};
    struct worker_msg_run in = {
        .call = {.seq = {.req = 5, .slot = 0}, .round = 9, .keep_len = 30, .sampling = some_sampling(),
                 .feed = feed, .n_feed = 1, .logprobs = {.on = true, .top = 0}},
    };
    struct protocol_frame frame;
    struct protocol_msg m = over_the_wire(worker_msg_run_encode(&in, &frame), &frame);
    struct worker_msg_run out;
    assert_int_equal(worker_msg_run_decode(&m, &limits, &out, err), 0);
    assert_true(out.call.logprobs.on);
    assert_int_equal(out.call.logprobs.top, 0);
    protocol_msg_free(&m);
    /* the target's prefill asks the same way, and names its round */
    struct worker_msg_prefill pin = {
        .seq = {.req = 5, .slot = 0}, .sampling = some_sampling(), .prompt = feed, .n_prompt = 1,
        .round = 1, .logprobs = {.on = true, .top = SAMPLING_TOP_LOGPROBS_MAX}};
    m = over_the_wire(worker_msg_prefill_encode(&pin, &frame), &frame);
    struct worker_msg_prefill pout;
    assert_int_equal(worker_msg_prefill_decode(&m, &limits, &pout, err), 0);
    assert_true(pout.logprobs.on && pout.logprobs.top == SAMPLING_TOP_LOGPROBS_MAX && pout.round == 1);
    cJSON_ReplaceItemInObjectCaseSensitive(m.header, "logprobs",
                                           cJSON_CreateNumber(SAMPLING_TOP_LOGPROBS_MAX + 1));
    assert_int_equal(worker_msg_prefill_decode(&m, &limits, &pout, err), ERR_PROTOCOL);
    assert_non_null(strstr(err, "logprobs"));
    protocol_msg_free(&m);

    int32_t tokens[2] = {1, 99};
    struct worker_msg_verify_done done = {
        .seq = {.req = 5, .slot = 0}, .round = 9, .n_accepted = 1, .idle_ms = -1, .draft_k = 1,
        .tokens = tokens, .n_tokens = 2, .has_logprobs = true,
    };
    done.logprobs[0] = (struct sampling_logprobs){.logprob = -0.1f, .n_top = 2, .top_ids = {1, 7},
                                                  .top_logprobs = {-0.1f, -2.3456789f}};
    done.logprobs[1] = (struct sampling_logprobs){.logprob = -1e-7f};
    m = over_the_wire(worker_msg_verify_done_encode(&done, &frame), &frame);
    struct worker_msg_verify_done dout;
    assert_int_equal(worker_msg_verify_done_decode(&m, &limits, &dout, err), 0);
    assert_true(dout.has_logprobs);
    assert_true(dout.logprobs[0].logprob == -0.1f);
    assert_int_equal(dout.logprobs[0].n_top, 2);
    assert_int_equal(dout.logprobs[0].top_ids[1], 7);
    assert_true(dout.logprobs[0].top_logprobs[1] == -2.3456789f);
    assert_true(dout.logprobs[1].logprob == -1e-7f);
    assert_int_equal(dout.logprobs[1].n_top, 0);
    /* one entry short, a positive logprob, an id pair cut in half */
    const char *bad[] = {"[[-1]]", "[[-1],[0.5]]", "[[-1],[-1,3]]"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cJSON_DeleteItemFromObjectCaseSensitive(m.header, "logprobs");
        cJSON_AddItemToObject(m.header, "logprobs", cJSON_Parse(bad[i]));
        assert_int_equal(worker_msg_verify_done_decode(&m, &limits, &dout, err), ERR_PROTOCOL);
        assert_non_null(strstr(err, "logprobs"));
    }
    protocol_msg_free(&m);
}

static void test_worker_msg_small_messages_round_trip(void **state)
{
    (void)state;
    char err[ERR_MSG_MAX] = "";
    int32_t prompt[4] = {1, 2, 3, 4};
    struct worker_msg_prefill p = {
        .seq = {.req = 1, .slot = 2}, .sampling = some_sampling(), .prompt = prompt, .n_prompt = 4,
    };
    struct protocol_frame frame;
    struct protocol_msg m = over_the_wire(worker_msg_prefill_encode(&p, &frame), &frame);
    struct worker_msg_prefill pout;
    assert_int_equal(worker_msg_prefill_decode(&m, &limits, &pout, err), 0);
    assert_int_equal(pout.seq.slot, 2);
    assert_int_equal(pout.n_prompt, 4);
    assert_sampling_equal(&pout.sampling, &p.sampling);
    protocol_msg_free(&m);

    struct worker_msg_draft_ready r = {
        .seq = {.req = 1, .slot = 2}, .half = 1, .round = 6, .k = 9, .guess = 77,
        .predraft = true, .draft_ms = 3.25,
    };
    m = over_the_wire(worker_msg_draft_ready_encode(&r), NULL);
    struct worker_msg_draft_ready rout;
    assert_int_equal(worker_msg_draft_ready_decode(&m, &limits, &rout, err), 0);
    assert_int_equal(rout.k, 9); /* k_max + 1: a pre-draft counts its guess */
    assert_int_equal(rout.guess, 77);
    assert_true(rout.predraft);
    assert_true(rout.draft_ms == 3.25);
    protocol_msg_free(&m);

    /* prefill_done: the prefix cache's figures when present, none when not */
    struct worker_msg_prefill_done pd = {
        .seq = {.req = 1, .slot = 2}, .prefill_ms = 4.5,
        .prefix = {.present = true, .looked_up = 40, .cached = 32, .cached_blocks = 7, .evictions = 3},
    };
    m = over_the_wire(worker_msg_prefill_done_encode(&pd), NULL);
    struct worker_msg_prefill_done pdout;
    assert_int_equal(worker_msg_prefill_done_decode(&m, &limits, &pdout, err), 0);
    assert_true(pdout.prefix.present);
    assert_int_equal(pdout.prefix.looked_up, 40);
    assert_int_equal(pdout.prefix.cached, 32);
    assert_int_equal(pdout.prefix.cached_blocks, 7);
    assert_int_equal(pdout.prefix.evictions, 3);
    protocol_msg_free(&m);
    pd.prefix.present = false;
    m = over_the_wire(worker_msg_prefill_done_encode(&pd), NULL);
    assert_int_equal(worker_msg_prefill_done_decode(&m, &limits, &pdout, err), 0);
    assert_false(pdout.prefix.present);
    assert_true(pdout.prefill_ms == 4.5);
    protocol_msg_free(&m);
    /* more found than looked up is refused, naming the field */
    pd.prefix = (struct worker_msg_prefix){.present = true, .looked_up = 8, .cached = 16};
    m = over_the_wire(worker_msg_prefill_done_encode(&pd), NULL);
    assert_int_equal(worker_msg_prefill_done_decode(&m, &limits, &pdout, err), ERR_PROTOCOL);
    assert_non_null(strstr(err, "cached"));
    protocol_msg_free(&m);

    struct worker_msg_seq rel = {.req = 8, .slot = 3}, relout;
    m = over_the_wire(worker_msg_release_encode(&rel), NULL);
    assert_int_equal(worker_msg_release_decode(&m, &limits, &relout, err), 0);
    assert_int_equal(relout.req, 8);
    assert_int_equal(relout.slot, 3);
    protocol_msg_free(&m);

    m = over_the_wire(worker_msg_error_encode(&rel, ERR_CONTEXT_FULL, "too long", "verify"), NULL);
    struct worker_msg_error e;
    worker_msg_error_decode(&m, &limits, &e);
    assert_int_equal(e.seq.req, 8);
    assert_string_equal(e.code, "context_full");
    assert_string_equal(e.message, "too long");
    assert_string_equal(e.in_reply_to, "verify");
    protocol_msg_free(&m);

    struct worker_msg_register reg = {
        .role = "draft", .pid = 4242, .model = "/m/draft", .backend = "cpu", .vocab_size = 100,
        .eos_ids = {98, 99}, .n_eos = 2, .max_seq_len = 64, .n_slots = 4, .bos_id = 97,
    };
    cJSON *shm = cJSON_CreateObject();
    cJSON_AddStringToObject(shm, "name", "/tandem-x-4242-draft");
    reg.shm = shm;
    m = over_the_wire(worker_msg_register_encode(&reg), NULL);
    cJSON_Delete(shm);
    struct worker_msg_register rg;
    assert_int_equal(worker_msg_register_decode(&m, &rg, err), 0);
    assert_string_equal(rg.role, "draft");
    assert_int_equal(rg.pid, 4242);
    assert_string_equal(rg.model, "/m/draft");
    assert_int_equal(rg.n_eos, 2);
    assert_int_equal(rg.eos_ids[1], 99);
    assert_int_equal(rg.bos_id, 97);
    assert_non_null(rg.shm);
    assert_int_equal(rg.drops, 0); /* absent: a worker that never lost its connection */
    protocol_msg_free(&m);

    /* drops tells a repeat from a worker that emptied its slots meanwhile */
    reg.drops = 3;
    shm = cJSON_CreateObject();
    cJSON_AddStringToObject(shm, "name", "/tandem-x-4242-draft");
    reg.shm = shm;
    m = over_the_wire(worker_msg_register_encode(&reg), NULL);
    cJSON_Delete(shm);
    assert_int_equal(worker_msg_register_decode(&m, &rg, err), 0);
    assert_int_equal(rg.drops, 3);
    cJSON_ReplaceItemInObject(m.header, "drops", cJSON_CreateNumber(-1));
    assert_int_equal(worker_msg_register_decode(&m, &rg, err), ERR_PROTOCOL);
    protocol_msg_free(&m);
}

static void test_worker_msg_decoders_refuse_out_of_range_fields(void **state)
{
    (void)state;
    char err[ERR_MSG_MAX] = "";
    int32_t feed[1] = {1};
    struct protocol_frame frame;

    /* slot past the worker's slots: named, req still known for the reply */
    struct worker_msg_draft d = {
        .seq = {.req = 11, .slot = 4}, .k = 2, .sampling = some_sampling(), .feed = feed, .n_feed = 1,
    };
    struct protocol_msg m = over_the_wire(worker_msg_draft_encode(&d, &frame), &frame);
    struct worker_msg_draft dout;
    assert_int_equal(worker_msg_draft_decode(&m, &limits, &dout, err), ERR_PROTOCOL);
    assert_non_null(strstr(err, "slot"));
    assert_int_equal(dout.seq.req, 11);
    assert_int_equal(dout.seq.slot, -1);
    protocol_msg_free(&m);

    /* more drafts than the draft's buffer holds */
    d.seq.slot = 0;
    d.k = limits.k_max + 1;
    m = over_the_wire(worker_msg_draft_encode(&d, &frame), &frame);
    assert_int_equal(worker_msg_draft_decode(&m, &limits, &dout, err), ERR_PROTOCOL);
    assert_non_null(strstr(err, "k:"));
    assert_int_equal(dout.seq.slot, 0);
    protocol_msg_free(&m);

    /* a verify must say which half holds its drafts */
    struct worker_msg_verify v = {
        .call = {.seq = {.req = 1, .slot = 0}, .sampling = some_sampling(), .feed = feed, .n_feed = 1},
        .k = 2, .half = 0,
    };
    cJSON *h = worker_msg_verify_encode(&v, &frame);
    cJSON_DeleteItemFromObject(h, "half");
    m = over_the_wire(h, &frame);
    struct worker_msg_verify vout;
    assert_int_equal(worker_msg_verify_decode(&m, &limits, &vout, err), ERR_PROTOCOL);
    assert_non_null(strstr(err, "half"));
    assert_int_equal(vout.call.seq.req, 1); /* still named for the error reply */
    protocol_msg_free(&m);

    /* an unknown draft mode */
    h = worker_msg_run_encode(&(struct worker_msg_run){.call = v.call}, &frame);
    cJSON_ReplaceItemInObject(h, "mode", cJSON_CreateString("lucky"));
    m = over_the_wire(h, &frame);
    struct worker_msg_run rout;
    assert_int_equal(worker_msg_run_decode(&m, &limits, &rout, err), ERR_PROTOCOL);
    assert_non_null(strstr(err, "mode"));
    protocol_msg_free(&m);

    /* verify_done: a token outside the vocabulary, and a count that does
     * not match n_accepted + 1 */
    int32_t tokens[2] = {5, 100};
    struct worker_msg_verify_done done = {
        .seq = {.req = 1, .slot = 0}, .round = 2, .n_accepted = 1, .idle_ms = -1,
        .tokens = tokens, .n_tokens = 2,
    };
    m = over_the_wire(worker_msg_verify_done_encode(&done, &frame), &frame);
    struct worker_msg_verify_done dd;
    assert_int_equal(worker_msg_verify_done_decode(&m, &limits, &dd, err), ERR_PROTOCOL);
    assert_non_null(strstr(err, "tokens[1]"));
    protocol_msg_free(&m);
    tokens[1] = 6;
    done.n_accepted = 2;
    m = over_the_wire(worker_msg_verify_done_encode(&done, &frame), &frame);
    assert_int_equal(worker_msg_verify_done_decode(&m, &limits, &dd, err), ERR_PROTOCOL);
    assert_non_null(strstr(err, "tokens"));
    protocol_msg_free(&m);

    /* a draft that does not say where its buffer is */
    struct worker_msg_register reg = {
        .role = "draft", .pid = 1, .model = "", .backend = "cpu", .vocab_size = 10,
        .max_seq_len = 8, .n_slots = 1, .bos_id = -1,
    };
    m = over_the_wire(worker_msg_register_encode(&reg), NULL);
    struct worker_msg_register rg;
    assert_int_equal(worker_msg_register_decode(&m, &rg, err), ERR_PROTOCOL);
    assert_non_null(strstr(err, "shm"));
    protocol_msg_free(&m);

    /* a role nobody plays */
    reg.role = "referee";
    m = over_the_wire(worker_msg_register_encode(&reg), NULL);
    assert_int_equal(worker_msg_register_decode(&m, &rg, err), ERR_PROTOCOL);
    assert_non_null(strstr(err, "role"));
    protocol_msg_free(&m);
}

/* One message per meaning of a target command: a run of plain steps
 * ("steps"; "step" on each answer, both absent meaning one), drafts matched
 * by the coordinator (verify_matched), the draft's half (verify, beside its
 * draft or not). A field of another meaning is refused by name. */
static void test_worker_msg_target_commands_one_per_meaning(void **state)
{
    (void)state;
    char err[ERR_MSG_MAX] = "";
    int32_t feed[1] = {42};
    const struct worker_msg_target_call call = {
        .seq = {.req = 5, .slot = 1}, .round = 3, .keep_len = 20, .sampling = some_sampling(), .feed = feed,
        .n_feed = 1};
    struct worker_msg_run r = {.call = call, .steps = 17};
    struct protocol_frame frame;
    struct protocol_msg m = over_the_wire(worker_msg_run_encode(&r, &frame), &frame);
    assert_string_equal(m.type, PROTOCOL_RUN);
    struct worker_msg_run rout;
    assert_int_equal(worker_msg_run_decode(&m, &limits, &rout, err), 0);
    assert_int_equal(rout.steps, 17);
    assert_int_equal(rout.call.keep_len, 20);
    assert_int_equal(rout.call.round, 3);
    assert_int_equal(rout.call.feed[0], 42);
    protocol_msg_free(&m);

    r.steps = 1;
    cJSON *h = worker_msg_run_encode(&r, &frame);
    assert_null(cJSON_GetObjectItemCaseSensitive(h, "steps")); /* one step: absent */
    m = over_the_wire(h, &frame);
    assert_int_equal(worker_msg_run_decode(&m, &limits, &rout, err), 0);
    assert_int_equal(rout.steps, 1);
    protocol_msg_free(&m);

    /* a run is bounded and carries no drafts */
    const int bad_steps[] = {0, -1, WORKER_MSG_STEPS_MAX + 1};
    for (size_t i = 0; i < sizeof bad_steps / sizeof bad_steps[0]; i++) {
        h = worker_msg_run_encode(&r, &frame);
        cJSON_AddNumberToObject(h, "steps", bad_steps[i]);
        m = over_the_wire(h, &frame);
        assert_int_equal(worker_msg_run_decode(&m, &limits, &rout, err), ERR_PROTOCOL);
        assert_non_null(strstr(err, "steps"));
        protocol_msg_free(&m);
    }
    h = worker_msg_run_encode(&r, &frame);
    cJSON_AddNumberToObject(h, "k", 2);
    m = over_the_wire(h, &frame);
    assert_int_equal(worker_msg_run_decode(&m, &limits, &rout, err), ERR_PROTOCOL);
    assert_non_null(strstr(err, "k: not a field of run"));
    protocol_msg_free(&m);

    /* the draft's half: beside its draft or not; never steps, never drafts */
    struct worker_msg_verify v = {.call = call, .k = 2, .half = 1, .await_draft = true};
    m = over_the_wire(worker_msg_verify_encode(&v, &frame), &frame);
    struct worker_msg_verify vout;
    assert_int_equal(worker_msg_verify_decode(&m, &limits, &vout, err), 0);
    assert_true(vout.await_draft);
    protocol_msg_free(&m);
    v.await_draft = false;
    h = worker_msg_verify_encode(&v, &frame);
    assert_null(cJSON_GetObjectItemCaseSensitive(h, "await_draft"));
    m = over_the_wire(h, &frame);
    assert_int_equal(worker_msg_verify_decode(&m, &limits, &vout, err), 0);
    assert_false(vout.await_draft);
    protocol_msg_free(&m);
    const int bad_k[] = {0, limits.k_max + 1};
    for (size_t i = 0; i < sizeof bad_k / sizeof bad_k[0]; i++) {
        v.k = bad_k[i];
        m = over_the_wire(worker_msg_verify_encode(&v, &frame), &frame);
        assert_int_equal(worker_msg_verify_decode(&m, &limits, &vout, err), ERR_PROTOCOL);
        assert_non_null(strstr(err, "k:"));
        protocol_msg_free(&m);
    }
    v.k = 2;
    h = worker_msg_verify_encode(&v, &frame);
    cJSON_AddNumberToObject(h, "steps", 2);
    m = over_the_wire(h, &frame);
    assert_int_equal(worker_msg_verify_decode(&m, &limits, &vout, err), ERR_PROTOCOL);
    assert_non_null(strstr(err, "steps: not a field of verify"));
    protocol_msg_free(&m);
    h = worker_msg_verify_encode(&v, &frame);
    cJSON_AddItemToObject(h, "drafts", cJSON_CreateIntArray((const int[]){1, 2}, 2));
    m = over_the_wire(h, &frame);
    assert_int_equal(worker_msg_verify_decode(&m, &limits, &vout, err), ERR_PROTOCOL);
    assert_non_null(strstr(err, "drafts: not a field of verify"));
    protocol_msg_free(&m);

    /* drafts made by the coordinator travel in the message: 1..k_max of
     * them, ids within the vocabulary, no half and no steps */
    struct worker_msg_verify_matched vm = {.call = call, .n_drafts = 3,
                                           .drafts = {4, 0, limits.vocab_size - 1}};
    m = over_the_wire(worker_msg_verify_matched_encode(&vm, &frame), &frame);
    assert_string_equal(m.type, PROTOCOL_VERIFY_MATCHED);
    struct worker_msg_verify_matched vmout;
    assert_int_equal(worker_msg_verify_matched_decode(&m, &limits, &vmout, err), 0);
    assert_int_equal(vmout.n_drafts, 3);
    assert_memory_equal(vmout.drafts, vm.drafts, 3 * sizeof(int32_t));
    assert_int_equal(vmout.call.keep_len, 20);
    protocol_msg_free(&m);
    vm.n_drafts = 0;
    m = over_the_wire(worker_msg_verify_matched_encode(&vm, &frame), &frame);
    assert_int_equal(worker_msg_verify_matched_decode(&m, &limits, &vmout, err), ERR_PROTOCOL);
    assert_non_null(strstr(err, "drafts: 0 of them"));
    protocol_msg_free(&m);
    vm.n_drafts = 3;
    vm.drafts[1] = limits.vocab_size;
    m = over_the_wire(worker_msg_verify_matched_encode(&vm, &frame), &frame);
    assert_int_equal(worker_msg_verify_matched_decode(&m, &limits, &vmout, err), ERR_PROTOCOL);
    assert_non_null(strstr(err, "drafts[1]"));
    protocol_msg_free(&m);
    vm.drafts[1] = 0;
    h = worker_msg_verify_matched_encode(&vm, &frame);
    cJSON_AddNumberToObject(h, "k", 3);
    m = over_the_wire(h, &frame);
    assert_int_equal(worker_msg_verify_matched_decode(&m, &limits, &vmout, err), ERR_PROTOCOL);
    assert_non_null(strstr(err, "k: not a field of verify_matched"));
    protocol_msg_free(&m);

    /* each decoder refuses the others' messages */
    m = over_the_wire(worker_msg_verify_matched_encode(&vm, &frame), &frame);
    assert_int_equal(worker_msg_verify_decode(&m, &limits, &vout, err), ERR_PROTOCOL);
    assert_int_equal(worker_msg_run_decode(&m, &limits, &rout, err), ERR_PROTOCOL);
    protocol_msg_free(&m);

    int32_t tokens[1] = {7};
    struct worker_msg_verify_done done = {
        .seq = {.req = 5, .slot = 1}, .round = 3, .idle_ms = -1, .step = 9, .tokens = tokens,
        .n_tokens = 1,
    };
    m = over_the_wire(worker_msg_verify_done_encode(&done, &frame), &frame);
    struct worker_msg_verify_done dout;
    assert_int_equal(worker_msg_verify_done_decode(&m, &limits, &dout, err), 0);
    assert_int_equal(dout.step, 9);
    protocol_msg_free(&m);
    done.step = 0; /* not written: one step */
    m = over_the_wire(worker_msg_verify_done_encode(&done, &frame), &frame);
    assert_null(cJSON_GetObjectItemCaseSensitive(m.header, "step"));
    assert_int_equal(worker_msg_verify_done_decode(&m, &limits, &dout, err), 0);
    assert_int_equal(dout.step, 1);
    cJSON_AddNumberToObject(m.header, "step", 0);
    assert_int_equal(worker_msg_verify_done_decode(&m, &limits, &dout, err), ERR_PROTOCOL);
    assert_non_null(strstr(err, "step"));
    protocol_msg_free(&m);
}

/* register's "cpu": the cores a CPU worker computes on, checked on arrival. */
static void test_worker_msg_register_carries_the_cores_it_uses(void **state)
{
    (void)state;
    char err[ERR_MSG_MAX] = "";
    struct worker_msg_register reg = {
        .role = "target", .pid = 7, .model = "/m/t", .backend = "cpu", .vocab_size = 100,
        .max_seq_len = 64, .n_slots = 1, .bos_id = -1,
        .cpu = {.present = true, .host = "0f2c9a52-5c4e-4b0e-9d1e-2a6e0c1b7f33", .threads = 2,
                .cpus = "0-1,4"},
    };
    struct protocol_msg m = over_the_wire(worker_msg_register_encode(&reg), NULL);
    struct worker_msg_register rg;
    assert_int_equal(worker_msg_register_decode(&m, &rg, err), 0);
    assert_true(rg.cpu.present);
    assert_string_equal(rg.cpu.host, reg.cpu.host);
    assert_int_equal(rg.cpu.threads, 2);
    assert_string_equal(rg.cpu.cpus, "0-1,4");
    assert_int_equal(cpulist_count(&rg.cpu.set), 3); /* parsed once, for the coordinator */
    assert_true(cpulist_has(&rg.cpu.set, 0) && cpulist_has(&rg.cpu.set, 1) && cpulist_has(&rg.cpu.set, 4));
    protocol_msg_free(&m);

    /* the pair it serves: absent means 0, beyond the limit refused */
    m = over_the_wire(worker_msg_register_encode(&reg), NULL);
    assert_null(cJSON_GetObjectItemCaseSensitive(m.header, "pair"));
    assert_int_equal(worker_msg_register_decode(&m, &rg, err), 0);
    assert_int_equal(rg.pair, 0);
    protocol_msg_free(&m);
    reg.pair = 3;
    m = over_the_wire(worker_msg_register_encode(&reg), NULL);
    assert_int_equal(worker_msg_register_decode(&m, &rg, err), 0);
    assert_int_equal(rg.pair, 3);
    cJSON_ReplaceItemInObjectCaseSensitive(m.header, "pair", cJSON_CreateNumber(8));
    assert_int_equal(worker_msg_register_decode(&m, &rg, err), ERR_PROTOCOL);
    assert_non_null(strstr(err, "pair"));
    reg.pair = 0;
    protocol_msg_free(&m);

    /* where its shared memory lives: carried as given, absent is "" */
    reg.shm_domain = "0f2c9a52-5c4e-4b0e-9d1e-2a6e0c1b7f33:27:1";
    m = over_the_wire(worker_msg_register_encode(&reg), NULL);
    assert_int_equal(worker_msg_register_decode(&m, &rg, err), 0);
    assert_string_equal(rg.shm_domain, reg.shm_domain);
    protocol_msg_free(&m);
    reg.shm_domain = NULL;
    m = over_the_wire(worker_msg_register_encode(&reg), NULL);
    assert_int_equal(worker_msg_register_decode(&m, &rg, err), 0);
    assert_string_equal(rg.shm_domain, "");
    protocol_msg_free(&m);

    /* a GPU worker says nothing of cores */
    reg.cpu.present = false;
    m = over_the_wire(worker_msg_register_encode(&reg), NULL);
    assert_null(cJSON_GetObjectItemCaseSensitive(m.header, "cpu"));
    assert_int_equal(worker_msg_register_decode(&m, &rg, err), 0);
    assert_false(rg.cpu.present);
    protocol_msg_free(&m);

    /* what it says is checked, and the field is named */
    reg.cpu.present = true;
    const char *bad_lists[] = {"", "1-0", "0,0", "x"};
    for (size_t i = 0; i < sizeof bad_lists / sizeof bad_lists[0]; i++) {
        reg.cpu.cpus = bad_lists[i];
        m = over_the_wire(worker_msg_register_encode(&reg), NULL);
        assert_int_equal(worker_msg_register_decode(&m, &rg, err), ERR_PROTOCOL);
        assert_non_null(strstr(err, "cpu.cpus"));
        protocol_msg_free(&m);
    }
    reg.cpu.cpus = "0";
    reg.cpu.threads = 0;
    m = over_the_wire(worker_msg_register_encode(&reg), NULL);
    assert_int_equal(worker_msg_register_decode(&m, &rg, err), ERR_PROTOCOL);
    assert_non_null(strstr(err, "cpu.threads"));
    protocol_msg_free(&m);
    reg.cpu.threads = 1;
    m = over_the_wire(worker_msg_register_encode(&reg), NULL);
    cJSON_DeleteItemFromObject(cJSON_GetObjectItemCaseSensitive(m.header, "cpu"), "host");
    assert_int_equal(worker_msg_register_decode(&m, &rg, err), ERR_PROTOCOL);
    assert_non_null(strstr(err, "cpu.host"));
    protocol_msg_free(&m);
}


/* A tree the coordinator made (verify_tree): drafts and parents round
 * trip; each malformed tree is refused naming what is wrong. One line a
 * case: the tree, then the words the refusal must hold. */
static void test_worker_msg_verify_tree_round_trips_and_refuses_bad_trees(void **state)
{
    (void)state;
    char err[ERR_MSG_MAX] = "";
    int32_t feed[1] = {42};
    const struct worker_msg_limits lim4 = {.n_slots = 4, .max_seq_len = 128, .k_max = 4, .vocab_size = 100};
    const struct worker_msg_target_call call = {
        .seq = {.req = 5, .slot = 1}, .round = 3, .keep_len = 20, .sampling = some_sampling(), .feed = feed,
        .n_feed = 1};
    struct protocol_frame frame;
    /* two branches under the root, one two deep */
    struct worker_msg_verify_tree t = {.call = call, .n_nodes = 4, .drafts = {7, 8, 9, 99},
                                       .parents = {-1, 0, -1, 2}};
    struct protocol_msg m = over_the_wire(worker_msg_verify_tree_encode(&t, &frame), &frame);
    assert_string_equal(m.type, PROTOCOL_VERIFY_TREE);
    struct worker_msg_verify_tree out;
    assert_int_equal(worker_msg_verify_tree_decode(&m, &lim4, &out, err), 0);
    assert_int_equal(out.n_nodes, 4);
    assert_memory_equal(out.drafts, t.drafts, 4 * sizeof(int32_t));
    assert_memory_equal(out.parents, t.parents, 4 * sizeof(int32_t));
    assert_int_equal(out.call.keep_len, 20);
    assert_int_equal(out.call.n_feed, 1);
    /* not a verify_matched: that one has no parents */
    struct worker_msg_verify_matched vm;
    assert_int_equal(worker_msg_verify_matched_decode(&m, &lim4, &vm, err), ERR_PROTOCOL);
    assert_non_null(strstr(err, "parents: not a field of verify_matched"));
    protocol_msg_free(&m);

    static const struct {
        int n_drafts, n_parents;
        int32_t parents[WORKER_MSG_TREE_NODES_MAX];
        int32_t bad_draft; /* -1: none */
        const char *why;
    } bad[] = {
        {3, 2, {-1, 0}, -1, "parents: 2 of them for 3 drafts"},              /* lengths differ */
        {2, 3, {-1, 0, 1}, -1, "parents: 3 of them for 2 drafts"},           /* lengths differ */
        {3, 3, {-1, 5, 0}, -1, "parents[1]: 5 is out of range"},             /* past the nodes */
        {3, 3, {-1, -2, 0}, -1, "parents[1]: -2 is out of range"},           /* below -1 */
        {3, 3, {-1, 2, -1}, -1, "parents[1]: 2 is not before its child"},    /* a later node */
        {3, 3, {-1, 1, 0}, -1, "parents[1]: 1 is not before its child"},     /* itself */
        {5, 5, {-1, 0, 1, 2, 3}, -1, "node 4 is 5 deep, more than k_max 4"}, /* deeper than k_max */
        {0, 0, {0}, -1, "drafts: none"},                                     /* empty */
        {32, 32, {-1}, -1, "drafts: more than 31 elements"},                 /* more than 31 + root */
        {2, 2, {-1, 0}, 100, "drafts[1]"},                                   /* outside the vocabulary */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cJSON *h = worker_msg_verify_tree_encode(&(struct worker_msg_verify_tree){.call = call, .n_nodes = 1},
                                                 &frame);
        assert_non_null(h);
        cJSON_DeleteItemFromObject(h, "drafts");
        cJSON_DeleteItemFromObject(h, "parents");
        int drafts[32] = {0}, parents[32] = {0};
        for (int j = 0; j < bad[i].n_parents && j < WORKER_MSG_TREE_NODES_MAX; j++)
            parents[j] = bad[i].parents[j];
        if (bad[i].bad_draft >= 0)
            drafts[1] = bad[i].bad_draft;
        cJSON_AddItemToObject(h, "drafts", cJSON_CreateIntArray(drafts, bad[i].n_drafts));
        cJSON_AddItemToObject(h, "parents", cJSON_CreateIntArray(parents, bad[i].n_parents));
        m = over_the_wire(h, &frame);
        int rc = worker_msg_verify_tree_decode(&m, &lim4, &out, err);
        if (rc != ERR_PROTOCOL || strstr(err, bad[i].why) == NULL)
            fail_msg("case %zu: rc %d, \"%s\", expected \"%s\"", i, rc, err, bad[i].why);
        protocol_msg_free(&m);
    }
    /* a field of another meaning */
    cJSON *h = worker_msg_verify_tree_encode(&t, &frame);
    cJSON_AddNumberToObject(h, "k", 4);
    m = over_the_wire(h, &frame);
    assert_int_equal(worker_msg_verify_tree_decode(&m, &lim4, &out, err), ERR_PROTOCOL);
    assert_non_null(strstr(err, "k: not a field of verify_tree"));
    protocol_msg_free(&m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_worker_msg_draft_round_trips),
        cmocka_unit_test(test_worker_msg_verify_and_verify_done_round_trip),
        cmocka_unit_test(test_worker_msg_logprobs_round_trip),
        cmocka_unit_test(test_worker_msg_small_messages_round_trip),
        cmocka_unit_test(test_worker_msg_decoders_refuse_out_of_range_fields),
        cmocka_unit_test(test_worker_msg_target_commands_one_per_meaning),
        cmocka_unit_test(test_worker_msg_verify_tree_round_trips_and_refuses_bad_trees),
        cmocka_unit_test(test_worker_msg_register_carries_the_cores_it_uses),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
