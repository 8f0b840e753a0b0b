#!/usr/bin/python3
"""Worker lanes (common/wire/lane.h): with an ipc:// worker endpoint both
workers move onto their lanes (stats: "lane"), the greedy output is the
target-only output, and a worker that dies is noticed from its lane's end of
file at once, long before worker_timeout_ms (10 s here: without the lane the
loss would take that long). A connection to the lane socket that shows a
wrong key, or nothing, is closed and disturbs no one. With
coordinator.worker_lane 0 everything stays on ZeroMQ and the output is the
same."""
import socket
import struct
import time

from tandem_e2e import Pipeline, check, collect, generate, main, next_event, reference

TIMEOUT_MS = 10000


def lanes(p):
    w = p.stats()["workers"]
    return w["draft"]["lane"], w["target"]["lane"]


def wait_lanes(p, want, timeout_s=10):
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if lanes(p) == want:
            return
        time.sleep(0.05)
    raise AssertionError("lanes %s, expected %s" % (lanes(p), want))


def test():
    p = Pipeline("lanes", worker_timeout_ms=TIMEOUT_MS)
    draft, target = p.make_pair()
    p.start_all()
    wait_lanes(p, (True, True))
    s = p.client()
    ids = [5, 6, 7, 8]
    ref = reference(target, ids, 60)["ids"]
    done, _ = generate(s, {"id": "a", "prompt_ids": ids, "max_tokens": 60, "temperature": 0})
    check(done.get("ids") == ref, "on lanes: %s, target-only %s" % (done.get("ids"), ref))
    check(p.stats()["spec"]["num_draft_tokens"] > 0, "the draft was not used")

    # Strangers on the lane socket: a wrong key, garbage, and silence.
    path = p.config["coordinator"]["worker_endpoint"][len("ipc://"):] + ".lane"
    strangers = []
    hello = b'{"v":1,"type":"lane","key":"' + b"0" * 32 + b'"}'
    wrong_key = struct.pack("<7I", 0x314E4C54, len(hello), 0, 0, 0, 0, 0) + hello
    for payload in (wrong_key, b"not a lane datagram", None):
        c = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        c.connect(path)
        if payload is not None:
            c.send(payload)
        strangers.append(c)
    t0 = time.time()
    for c in strangers:
        c.settimeout(10)
        check(c.recv(16) == b"", "a stranger's connection was answered")
        c.close()
    check(time.time() - t0 < 5, "a silent connection was kept %.1f s" % (time.time() - t0))
    check(lanes(p) == (True, True), "strangers disturbed the lanes: %s" % (lanes(p),))
    done, _ = generate(s, {"id": "b", "prompt_ids": ids, "max_tokens": 60, "temperature": 0})
    check(done.get("ids") == ref, "after strangers: %s" % done)

    # A dead draft: lost at once; the request finishes target-only.
    s.send_json({"v": 1, "type": "generate", "id": "long", "prompt_ids": ids, "max_tokens": 2000,
                 "temperature": 0, "stream": True})
    check(next_event(s, "long")["type"] == "token", "long request did not start")
    p.kill("draft")
    t0 = time.time()
    while p.stats()["workers"]["draft"]["losses"] == 0:
        check(time.time() - t0 < TIMEOUT_MS / 2000.0, "the dead draft was not noticed from its lane")
        time.sleep(0.02)
    done, _ = collect(s, "long", 120)
    check(done.get("ids") == reference(target, ids, 2000)["ids"], "after the draft died: %s" %
          {k: v for k, v in done.items() if k != "ids"})
    p.start("draft")
    p.wait_workers(draft=True, target=True)
    wait_lanes(p, (True, True))

    # A dead target: its request fails at once, not after worker_timeout_ms.
    s.send_json({"v": 1, "type": "generate", "id": "doomed", "prompt_ids": ids, "max_tokens": 2000,
                 "temperature": 0, "stream": True})
    check(next_event(s, "doomed")["type"] == "token", "doomed request did not start")
    p.kill("target")
    t0 = time.time()
    m, _ = collect(s, "doomed", 60)
    if m["type"] != "done":
        check(m["type"] == "error" and m["code"] == "target_unavailable", "when the target died: %s" % m)
        check(time.time() - t0 < TIMEOUT_MS / 2000.0, "target_unavailable took %.1f s" % (time.time() - t0))
    s.close()

    # Lanes off: ZeroMQ only, the same output (the models are p's).
    q = Pipeline("nolanes", worker_timeout_ms=TIMEOUT_MS, extra={"coordinator": {"worker_lane": 0}})
    q.config["draft_worker"]["model"], q.config["target_worker"]["model"] = draft, target
    q.start_all()
    s = q.client()
    done, _ = generate(s, {"id": "z", "prompt_ids": ids, "max_tokens": 60, "temperature": 0})
    check(done.get("ids") == ref, "without lanes: %s" % done)
    check(lanes(q) == (False, False), "lanes with worker_lane 0: %s" % (lanes(q),))
    s.close()
    q.close()
    p.close()


if __name__ == "__main__":
    main(test)
