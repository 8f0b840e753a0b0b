/* fuzz_worker_msg.c: a coordinator <-> worker message from fuzz bytes,
 * through every decoder of common/wire/worker_msg.c.
 *
 * Input: byte 0 = shape (bit 0: a token frame follows; bit 1: a second,
 * empty frame; bit 2: vocabulary unchecked), bytes 1-2 = header length L
 * (little-endian), then L bytes of header JSON, then the token frame. The
 * message is built as protocol_recv leaves it: the header parsed with
 * cJSON_ParseWithLength and accepted only as an object with "v":1 and a
 * non-empty string "type" (the envelope check protocol_recv makes before
 * any decoder runs), frames copied into their own malloc'd buffers so ASan
 * sees their exact size. Every decoder is run on every message: a decoder
 * meets only its own type in the processes, but none may trust that. */
#include "fuzz_common.h"

#include "error.h"
#include "worker_msg.h"

/* protocol.c's check_header: what a decoder may rely on. */
static int envelope_ok(struct protocol_msg *msg)
{
    const cJSON *h = msg->header;
    if (!cJSON_IsObject(h))
        return 0;
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(h, "v");
    if (!cJSON_IsNumber(v) || v->valuedouble != (double)PROTOCOL_VERSION)
        return 0;
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(h, "type");
    if (!cJSON_IsString(t) || t->valuestring[0] == '\0')
        return 0;
    msg->type = t->valuestring;
    return 1;
}

static void check_tokens(const int32_t *tokens, int n)
{
    volatile int32_t sink = 0;
    for (int i = 0; i < n; i++)
        sink ^= tokens[i];
    (void)sink;
}

static void decode_all(const struct protocol_msg *msg, const struct worker_msg_limits *lim)
{
    char err[ERR_MSG_MAX];
    struct worker_msg_prefill pf;
    if (worker_msg_prefill_decode(msg, lim, &pf, err) == 0)
        check_tokens(pf.prompt, pf.n_prompt);
    struct worker_msg_prefill_done pd;
    (void)worker_msg_prefill_done_decode(msg, lim, &pd, err);
    struct worker_msg_draft d;
    if (worker_msg_draft_decode(msg, lim, &d, err) == 0)
        check_tokens(d.feed, d.n_feed);
    struct worker_msg_draft_ready dr;
    (void)worker_msg_draft_ready_decode(msg, lim, &dr, err);
    struct worker_msg_run r;
    if (worker_msg_run_decode(msg, lim, &r, err) == 0)
        check_tokens(r.call.feed, r.call.n_feed);
    struct worker_msg_verify_matched vm;
    if (worker_msg_verify_matched_decode(msg, lim, &vm, err) == 0) {
        if (vm.n_drafts < 1 || vm.n_drafts > SPECULATE_K_MAX)
            abort();
        check_tokens(vm.drafts, vm.n_drafts);
        check_tokens(vm.call.feed, vm.call.n_feed);
    }
    struct worker_msg_verify_tree vt;
    if (worker_msg_verify_tree_decode(msg, lim, &vt, err) == 0) {
        if (vt.n_nodes < 1 || vt.n_nodes > WORKER_MSG_TREE_NODES_MAX)
            abort();
        for (int i = 0; i < vt.n_nodes; i++)
            if (vt.parents[i] < -1 || vt.parents[i] >= i)
                abort();
        check_tokens(vt.drafts, vt.n_nodes);
        check_tokens(vt.call.feed, vt.call.n_feed);
    }
    struct worker_msg_verify v;
    if (worker_msg_verify_decode(msg, lim, &v, err) == 0)
        check_tokens(v.call.feed, v.call.n_feed);
    struct worker_msg_verify_done vd;
    if (worker_msg_verify_done_decode(msg, lim, &vd, err) == 0) {
        if (vd.n_tokens != vd.n_accepted + 1)
            abort();
        check_tokens(vd.tokens, vd.n_tokens);
        for (int i = 0; lim->vocab_size > 0 && i < vd.n_tokens; i++)
            if (vd.tokens[i] < 0 || vd.tokens[i] >= lim->vocab_size)
                abort();
    }
    struct worker_msg_seq rel;
    (void)worker_msg_release_decode(msg, lim, &rel, err);
    struct worker_msg_error e;
    worker_msg_error_decode(msg, lim, &e);
    if (!e.code || !e.message)
        abort(); /* documented to default to "" */
    (void)strlen(e.code);
    (void)strlen(e.message);
    if (e.in_reply_to)
        (void)strlen(e.in_reply_to);
    struct worker_msg_register reg;
    if (worker_msg_register_decode(msg, &reg, err) == 0) {
        if (reg.n_eos < 0 || reg.n_eos > WORKER_MSG_EOS_MAX)
            abort();
        (void)strlen(reg.role);
        (void)strlen(reg.model);
        (void)strlen(reg.backend);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 3)
        return 0;
    unsigned shape = data[0];
    size_t header_len = (size_t)data[1] | (size_t)data[2] << 8;
    data += 3;
    size -= 3;
    if (header_len > size)
        header_len = size;
    struct protocol_msg msg;
    memset(&msg, 0, sizeof msg);
    msg.header = cJSON_ParseWithLength((const char *)data, header_len);
    if (!msg.header || !envelope_ok(&msg)) {
        protocol_msg_free(&msg);
        return 0;
    }
    msg.total_bytes = size;
    if (shape & 1u) {
        size_t frame_len = size - header_len;
        msg.frame_data[0] = malloc(frame_len > 0 ? frame_len : 1);
        if (!msg.frame_data[0]) {
            protocol_msg_free(&msg);
            return 0;
        }
        memcpy(msg.frame_data[0], data + header_len, frame_len);
        msg.frame_size_bytes[0] = frame_len;
        msg.n_frames = 1;
        if (shape & 2u) {
            msg.frame_data[1] = malloc(1);
            msg.frame_size_bytes[1] = 0;
            msg.n_frames = msg.frame_data[1] ? 2 : 1;
        }
    }
    struct worker_msg_limits lim = {
        .n_slots = 4, .max_seq_len = 64, .k_max = 8, .vocab_size = (shape & 4u) ? 0 : 512};
    decode_all(&msg, &lim);
    protocol_msg_free(&msg);
    return 0;
}
