#!/usr/bin/python3
"""A client that stops reading its stream: once its queue at the coordinator
is full, its request is cancelled and it gets, when it reads again, the
token events that did go out and then a terminal error (cancelled, saying
it did not read its replies), never a stream that just stops; the stats
and the Prometheus text count it; other clients are served meanwhile."""
import time

import zmq

from tandem_e2e import Pipeline, check, generate, main, next_event, reference


def test():
    p = Pipeline("slowclient")
    _, target = p.make_pair()
    p.start_all()
    slow = p.zctx.socket(zmq.DEALER)
    slow.setsockopt(zmq.LINGER, 0)
    slow.setsockopt(zmq.RCVHWM, 1)
    slow.setsockopt(zmq.RCVBUF, 4096)
    slow.connect(p.endpoint)
    # one token a round (no drafts): as many token events as tokens; an EOS
    # must not end it first (which greedy output has one depends on the
    # kernels' bits: vdpbf16ps made the tiny model's an EOS at 132)
    slow.send_json({"v": 1, "type": "generate", "id": "slow", "prompt_ids": [3, 4, 5], "max_tokens": 8000,
                    "temperature": 0, "stream": True, "draft": "none", "ignore_eos": True})
    deadline = time.time() + 240
    cancels = 0
    while time.time() < deadline and cancels == 0:
        time.sleep(0.2)
        cancels = p.stats()["requests"]["slow_client_cancels"]
    check(cancels == 1, "the slow client's request was not cancelled within 240 s (stats %s)" % p.stats()["requests"])
    # the others are served meanwhile
    s = p.client()
    done, _ = generate(s, {"id": "other", "prompt_ids": [7, 8, 9], "max_tokens": 8, "temperature": 0})
    check(done.get("ids") == reference(target, [7, 8, 9], 8)["ids"], "another client meanwhile: %s" % done)
    s.close()
    # reading again: what went out, then the reason
    tokens, m = 0, None
    while True:
        m = next_event(slow, "slow", 60)
        if m["type"] != "token":
            break
        tokens += len(m["ids"])
    check(m["type"] == "error" and m["code"] == "cancelled" and "did not read its replies" in m["message"],
          "the slow client's last reply: %s" % m)
    check(tokens > 100, "only %d tokens reached the slow client before its queue was full" % tokens)
    prom = p.stats()["prometheus"]
    check("tandem_slow_client_cancels_total 1" in prom, "Prometheus: %s" % [l for l in prom.split("\n") if "slow" in l])
    print("slow client: cancelled after %d tokens were delivered; then told why" % tokens)
    slow.close()
    p.close()


if __name__ == "__main__":
    main(test)
