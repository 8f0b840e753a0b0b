#!/usr/bin/python3
"""A client that takes over the routing id of a client that dropped must not
receive that client's replies (issue 15).

Client A sets ZMQ_ROUTING_ID, starts a long streamed request, reads one token
and closes its socket. Client B connects with the same routing id at once and
listens: it must get nothing of A's request, whose slot must be freed (it is
cancelled when the coordinator sees A's connection drop). Tried ROUNDS times,
with other requests running so that each round of A's request takes long
enough for B to get in before A's next token. Then B's own request under
that id is served normally.
"""
import time

import zmq

from tandem_e2e import Pipeline, check, collect, main, next_event, no_eos

ROUNDS = 12
ROUNDS_MAX = 48
LISTEN_S = 1.0


def dealer(p, routing_id=None):
    s = p.zctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    if routing_id is not None:
        s.setsockopt(zmq.ROUTING_ID, routing_id)
    s.connect(p.endpoint)
    return s


def test():
    p = Pipeline("rid", max_concurrency=6, max_queue=8)
    draft, target = p.make_pair()
    no_eos(draft, target)
    p.start_all()
    # Background load: long requests on another socket, so A's rounds are slow.
    bg = dealer(p)
    for i in range(3):
        bg.send_json({"v": 1, "type": "generate", "id": "bg-%d" % i, "prompt_ids": [9, 8, 7], "max_tokens": 8000,
                      "temperature": 0, "stream": False})
    leaks = []
    # ROUNDS rounds, then more (up to ROUNDS_MAX) while none has met the
    # race: a reply of A's request coming due after A's connection dropped
    # (counted by the coordinator as withheld), which depends on timing
    r, withheld = 0, 0
    while r < ROUNDS or (withheld == 0 and r < ROUNDS_MAX):
        rid = b"victim-%d" % r
        a = dealer(p, rid)
        a.send_json({"v": 1, "type": "generate", "id": "secret-%d" % r, "prompt_ids": [5, 6, 7],
                     "max_tokens": 8000, "temperature": 0, "stream": True})
        m = next_event(a, "secret-%d" % r, 30)
        check(m["type"] == "token", "A's first reply: %s" % m)
        a.close(linger=0)
        b = dealer(p, rid)
        deadline = time.time() + LISTEN_S
        while True:
            left = deadline - time.time()
            if left <= 0 or not b.poll(int(left * 1000)):
                break
            leaks.append((r, b.recv_json()))
        b.close(linger=0)
        r += 1
        if r >= ROUNDS:
            withheld = p.stats()["requests"]["replies_withheld"]
    check(leaks == [], "a client that took a dropped client's routing id received its replies: %d messages, "
          "first %s" % (len(leaks), leaks[:1]))
    # the race was met: replies of A's requests came due after their
    # connection dropped, and were withheld rather than sent to the id
    withheld = p.stats()["requests"]["replies_withheld"]
    print("routing id reuse: %d replies withheld from dropped connections over %d rounds" % (withheld, r))
    check(withheld > 0, "no reply came due after a connection dropped: the test never met its race")
    # Every A request was cancelled: only the background requests still run.
    deadline = time.time() + 5
    while True:
        req = p.stats()["requests"]
        if req["active"] + req["queued"] <= 3:  # the background ones, if they still run
            break
        check(time.time() < deadline, "the dropped clients' requests still run: %s" % req)
        time.sleep(0.05)
    check(req["errors"]["cancelled"] >= r, "dropped clients' requests not counted as cancelled: %s" % req)
    # The id itself is not banned: a new connection under it is served.
    b = dealer(p, b"victim-0")
    done, _ = collect_one(b)
    check(done["type"] == "done" and len(done["ids"]) == 4, "a request under a reused routing id: %s" % done)
    b.close(linger=0)
    bg.close(linger=0)


def collect_one(sock):
    sock.send_json({"v": 1, "type": "generate", "id": "mine", "prompt_ids": [1, 2, 3], "max_tokens": 4,
                    "temperature": 0})
    return collect(sock, "mine", 60)


if __name__ == "__main__":
    main(test)
