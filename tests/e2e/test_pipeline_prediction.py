#!/usr/bin/python3
"""Predicted outputs (the request's "prediction", OpenAI's field): the given
text is a draft source the coordinator takes before the others, verified as
point masses like every draft made there, on the trained pair.

1. The prediction is the output itself (target-only greedy output, as text):
   the same ids, almost every token accepted from it (the done reply's
   usage.accepted_prediction_tokens; rejected ones only where the text's
   tokenization differs from the model's), in fewer rounds than tokens.
2. A prediction that diverges half way (a word changed, a line dropped)
   still gives target-only output, for every draft source behind it.
3. Batched with requests without one, and a prediction of the wrong shape
   is invalid_request naming the field.
4. Through the gateway, OpenAI's prediction {"type": "content", ...}: the
   same content, and usage.completion_tokens_details counts the
   prediction's tokens accepted and rejected."""
import json

from tandem_e2e import Pipeline, check, generate, generate_concurrently, http, main, require_gateway

PROMPTS = ["Write a Python function named read_config.", "Write a short poem about two bicycles riding in tandem."]
MAX_TOKENS = 160


def test():
    p = Pipeline("pred", max_concurrency=8, max_queue=32, extra={"coordinator": {"spec_k_max": 8}})
    require_gateway()
    p.use_pair("trained")
    base_url = p.enable_gateway()
    p.start_all()
    p.start("gateway")
    p.wait_http()
    s = p.client()
    for i, q in enumerate(PROMPTS):
        base = {"messages": [{"role": "user", "content": q}], "max_tokens": MAX_TOKENS, "temperature": 0}
        ref, _ = generate(s, dict(base, id="r%d" % i, draft="none"))
        check(ref["type"] == "done" and len(ref["ids"]) > 40, "reference: %s" % ref)
        exact, _ = generate(s, dict(base, id="e%d" % i, draft="none", prediction=ref["text"]))
        u = exact["usage"]
        print("prompt %d: %d tokens, prediction accepted %d rejected %d, %d rounds" %
              (i, len(exact["ids"]), u["accepted_prediction_tokens"], u["rejected_prediction_tokens"],
               exact["spec"]["rounds"]))
        check(exact["ids"] == ref["ids"], "exact prediction: %s != %s" % (exact["ids"], ref["ids"]))
        check(u["accepted_prediction_tokens"] >= 0.8 * len(ref["ids"]),
              "exact prediction: only %d of %d tokens accepted" % (u["accepted_prediction_tokens"], len(ref["ids"])))
        check(exact["spec"]["rounds"] < len(ref["ids"]) / 2, "exact prediction: %d rounds" % exact["spec"]["rounds"])
        text = ref["text"]
        half = len(text) // 2
        edits = [text[:half] + " banana " + text[half + 5:], text[:half], text[: half // 2] + text[half:],
                 "nothing like it at all " * 5]
        for j, pred in enumerate(edits):
            for src in ("none", "model", "ngram", "auto"):
                done, _ = generate(s, dict(base, id="d%d%d%s" % (i, j, src), draft=src, spec_k=6, prediction=pred))
                check(done.get("ids") == ref["ids"], "prompt %d, edit %d, draft %s: %s != %s" %
                      (i, j, src, done.get("ids"), ref["ids"]))
                check("accepted_prediction_tokens" in done["usage"], "usage: %s" % done["usage"])
        reqs = []
        for j in range(4):
            reqs.append(dict(base, id="b%d%d" % (i, j), draft="model", prediction=edits[j % 2]))
            reqs.append({"id": "n%d%d" % (i, j), "prompt": q, "max_tokens": 30, "temperature": 0, "draft": "model"})
        plain, _ = generate(s, {"id": "pl%d" % i, "prompt": q, "max_tokens": 30, "temperature": 0, "draft": "none"})
        for req, done in zip(reqs, generate_concurrently(p, reqs)):
            want = ref["ids"] if req["id"][0] == "b" else plain["ids"]
            check(done.get("ids") == want, "batched %s: %s != %s" % (req["id"], done.get("ids"), want))
        for pred in (ref["text"], [{"type": "text", "text": ref["text"][:half]}, {"type": "text", "text": text[half:]}]):
            status, _, body = http("POST", base_url + "/v1/chat/completions", dict(
                base, prediction={"type": "content", "content": pred}))
            check(status == 200, "gateway: %d %s" % (status, body[:300]))
            answer = json.loads(body)
            check(answer["choices"][0]["message"]["content"] == ref["text"], "gateway: %r" % answer["choices"][0])
            d = answer["usage"]["completion_tokens_details"]
            check(d["accepted_prediction_tokens"] >= 0.8 * len(ref["ids"]) and d["rejected_prediction_tokens"] == 0,
                  "gateway usage: %s" % answer["usage"])
        status, _, body = http("POST", base_url + "/v1/chat/completions", dict(base, prediction={"type": "x"}))
        check(status == 400 and json.loads(body)["error"]["param"] == "prediction", "gateway bad: %s" % body[:300])
    for bad in (5, {"type": "text", "content": "x"}, {"type": "content"}, {"type": "content", "content": "x", "y": 1}):
        err, _ = generate(s, {"id": "bad", "prompt": "x", "prediction": bad})
        check(err["type"] == "error" and err["code"] == "invalid_request" and err["message"].startswith("prediction"),
              "%s: %s" % (json.dumps(bad), err))


if __name__ == "__main__":
    main(test)
