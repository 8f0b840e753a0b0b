#!/usr/bin/python3
"""message_rss.py: the coordinator's resident memory before and after a burst
of large client messages (issue 15, defect 6).

Starts a pipeline on temporary endpoints (tests/e2e/tandem_e2e.py; set
TANDEM_BUILD_DIR), reads the coordinator's VmRSS, then N clients each send one
message of --bytes bytes at once (default: 1 KiB under the hard cap
max_message_bytes x --factor), waits for every reply (or the dropped
connection), and reads VmRSS and VmHWM (peak) again.

  TANDEM_BUILD_DIR=build tools/measure/message_rss.py [--factor 2] [--bytes N] [--clients 16]
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "e2e"))
from tandem_e2e import Pipeline  # noqa: E402


def vm(pid, key):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024.0  # MiB
    return -1.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--factor", type=int, default=2, help="the build's COORD_HARD_MESSAGE_FACTOR")
    ap.add_argument("--max-message-bytes", type=int, default=1 << 20)
    ap.add_argument("--bytes", type=int, default=0, help="message size (default: 1 KiB under the hard cap)")
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    size = a.bytes or a.max_message_bytes * a.factor - 1024
    p = Pipeline("rss", extra={"coordinator": {"max_message_bytes": a.max_message_bytes}})
    p.make_pair()
    p.start_all()
    pid = p.procs["coordinator"].pid
    time.sleep(0.5)
    before = vm(pid, "VmRSS")
    head = b'{"v":1,"type":"generate","id":"big","prompt":"'
    msg = head + b"x" * (size - len(head) - 2) + b'"}'
    socks = [p.client() for _ in range(a.clients)]
    replies = 0
    for _ in range(a.rounds):
        for s in socks:
            s.send(msg)
        for s in socks:
            if s.poll(20000):
                s.recv()
                replies += 1
    time.sleep(0.5)
    after = vm(pid, "VmRSS")
    peak = vm(pid, "VmHWM")
    for s in socks:
        s.close()
    print("%d clients x %d rounds x %d bytes (max_message_bytes %d, hard cap x%d): %d replies" %
          (a.clients, a.rounds, size, a.max_message_bytes, a.factor, replies))
    print("coordinator VmRSS before %.1f MiB, after %.1f MiB (+%.1f), peak VmHWM %.1f MiB" %
          (before, after, after - before, peak))
    p.close()


if __name__ == "__main__":
    main()
