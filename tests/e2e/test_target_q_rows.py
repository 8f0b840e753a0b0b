#!/usr/bin/python3
"""Where the target reads a sampled verification's q rows, seen from the wire
(docs/protocol-notes.md, the buffer descriptor's `cuda.q_rows`), on the CPU.

This test plays the coordinator (a ROUTER on the worker endpoint) and the draft
(a POSIX segment laid out like the draft's buffer, one published half) for a real
target worker on the CPU backend, and names the buffer with a cuda_ipc
descriptor whose handles are well formed but never opened (a CPU target reads
the host face):
- q_rows "slab": the draft's kernels wrote the q rows only into its GPU slab,
  which this target cannot read. A sampled verification gets
  `error {code: "unavailable"}` naming shm_staging (never a verification against
  whatever stale bytes the host face holds); a greedy verification of the same
  half is served (it needs only the tokens); the target's log says where q rows
  would come from ("nowhere").
- q_rows "host_face" (and a descriptor without the field, an older draft): the
  same sampled verification is served.
"""
import json
import mmap
import os
import struct
import subprocess
import time

from tandem_e2e import Pipeline, binary, check, main, zmq

HEADER = struct.Struct("<QQIIII")  # struct shm_half_header: seq, req, round, k, first, guess
ALIGN = 64


def align_up(n):
    return (n + ALIGN - 1) // ALIGN * ALIGN


def layout(n_slots, k_max, vocab):
    """shm_layout_init (common/wire/shm_buffer.c)."""
    rows = k_max + 1
    tokens_offset = HEADER.size
    q_offset = align_up(tokens_offset + rows * 4)
    half_bytes = q_offset + align_up(rows * vocab * 4)
    return {"tokens_offset": tokens_offset, "q_offset": q_offset, "half_bytes": half_bytes,
            "size_bytes": n_slots * 2 * half_bytes}


class FakeDraftBuffer:
    """A segment named like a draft's, with one published half (slot 0, half 0)."""

    def __init__(self, instance, tag, n_slots, k_max, vocab):
        self.lay = layout(n_slots, k_max, vocab)
        self.n_slots, self.k_max, self.vocab = n_slots, k_max, vocab
        self.name = "/tandem-%s-%d-%s" % (instance, os.getpid(), tag)
        self.path = "/dev/shm" + self.name
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, self.lay["size_bytes"])
            self.map = mmap.mmap(fd, self.lay["size_bytes"])
        finally:
            os.close(fd)

    def publish(self, req, rnd, tokens, q_rows):
        """Tokens and q rows of slot 0 half 0, then its header with an even seq."""
        t0, q0 = self.lay["tokens_offset"], self.lay["q_offset"]
        self.map[t0:t0 + 4 * len(tokens)] = struct.pack("<%di" % len(tokens), *tokens)
        flat = [x for row in q_rows for x in row]
        self.map[q0:q0 + 4 * len(flat)] = struct.pack("<%df" % len(flat), *flat)
        self.map[0:HEADER.size] = HEADER.pack(2, req, rnd, len(tokens), 0, 0)

    def descriptor(self, q_rows):
        lay = self.lay
        cuda = {"device_uuid": "GPU-0123abcd-4567-89ab-cdef-0123456789ab", "mode": "device",
                "mem_handle": "ab" * 64, "slab_bytes": lay["size_bytes"] + ALIGN,
                "half_bytes": lay["half_bytes"], "tokens_offset": lay["tokens_offset"],
                "q_offset": lay["q_offset"], "probe_offset": lay["size_bytes"], "probe": [1, 2, 3, 4],
                "events": ["cd" * 64] * (2 * self.n_slots)}
        if q_rows is not None:
            cuda["q_rows"] = q_rows
        return {"transport": "cuda_ipc", "name": self.name, "size_bytes": lay["size_bytes"],
                "n_slots": self.n_slots, "k_max": self.k_max, "vocab": self.vocab, "cuda": cuda}

    def close(self):
        self.map.close()
        os.unlink(self.path)


class FakeCoordinator:
    def __init__(self, endpoint):
        self.sock = zmq.Context.instance().socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.bind(endpoint)
        self.target = None

    def recv(self, timeout_s=60, want=None):
        """The next message (header, frames) other than a heartbeat (or of type want)."""
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            if not self.sock.poll(200):
                continue
            parts = self.sock.recv_multipart()
            header = json.loads(parts[1])
            if header.get("type") == "heartbeat" or (want and header.get("type") != want):
                continue
            self.target = parts[0]
            return header, parts[2:]
        check(False, "the target sent nothing (waiting for %s)" % (want or "a reply"))

    def send(self, header, frames=()):
        header = dict({"v": 1}, **header)
        self.sock.send_multipart([self.target, json.dumps(header).encode()] + list(frames))


def verify(coord, req, tokens, sampling, descriptor=None):
    msg = {"type": "verify", "req": req, "slot": 0, "round": req, "keep_len": 0, "k": len(tokens),
           "half": 0, "sampling": sampling, "mode": "sampled"}
    if descriptor:
        msg["shm"] = descriptor
    coord.send(msg, [struct.pack("<3i", 5, 6, 7)])
    while True:
        h, frames = coord.recv()
        if h.get("type") in ("verify_done", "error"):
            return h, frames


def test():
    p = Pipeline("qrows", worker_timeout_ms=60000, max_concurrency=1,
                 extra={"target_worker": {"max_seq_len": 256}})
    draft, target = p.make_pair()
    coord = FakeCoordinator(p.config["coordinator"]["worker_endpoint"])
    p.start("target")
    reg, _ = coord.recv(want="register")
    check(reg.get("role") == "target", "expected the target's register, got %s" % reg)
    vocab = reg["vocab_size"]
    k_max = 8  # coordinator.spec_k_max's default: the draft's buffer holds k_max + 1 rows
    coord.send({"type": "welcome", "role": "target", "heartbeat_ms": 200})
    sampled = {"temperature": 0.9, "seed": "5"}
    greedy = {"temperature": 0}
    drafts = [11, 12]
    uniform = [[1.0 / vocab] * vocab for _ in drafts]
    buffers = []
    try:
        # q rows only in the draft's slab: sampled verifications cannot be served
        slab = FakeDraftBuffer(p.instance, "draft", 1, k_max, vocab)
        buffers.append(slab)
        slab.publish(1, 1, drafts, [[0.0] * vocab for _ in drafts])  # stale host face
        h, _ = verify(coord, 1, drafts, sampled, slab.descriptor("slab"))
        check(h.get("type") == "error" and h.get("code") == "unavailable",
              "sampled verify with q rows only in the slab: expected error unavailable, got %s" % h)
        for needle in ("only into its GPU slab", "shm_staging"):
            check(needle in h.get("message", ""), "error message %r lacks %r" % (h.get("message"), needle))
        with open(p.logs["target"]) as f:
            log = f.read()
        check("sampled verifications take q rows nowhere" in log,
              "the target log does not say it cannot read q rows:\n%s" % p.log_tail("target"))
        # the same half, greedy: only the tokens are read
        slab.publish(2, 2, drafts, [[0.0] * vocab for _ in drafts])
        h, frames = verify(coord, 2, drafts, greedy)
        check(h.get("type") == "verify_done" and len(frames) == 1,
              "greedy verify over a slab-only buffer: expected verify_done, got %s" % h)
        ref = json.loads(subprocess.run(
            [binary("generate"), "--model", target, "--ids", "5,6,7", "--max-tokens", "1", "--temperature", "0",
             "--threads", "1", "--json"], capture_output=True, text=True, check=True).stdout)["ids"]
        got = list(struct.unpack("<%di" % (len(frames[0]) // 4), frames[0]))
        # accepted (then it is the draft) or corrected: either way target-only greedy's token
        check(got[0] == ref[0], "greedy verify: first token %d, target-only greedy gives %d" % (got[0], ref[0]))

        # q rows in the host face (and no field: an older draft): served
        for tag, field in (("draft2", "host_face"), ("draft3", None)):
            buf = FakeDraftBuffer(p.instance, tag, 1, k_max, vocab)
            buffers.append(buf)
            buf.publish(3, 3, drafts, uniform)
            h, frames = verify(coord, 3, drafts, sampled, buf.descriptor(field))
            check(h.get("type") == "verify_done" and len(frames) == 1 and h.get("draft_k") == len(drafts),
                  "sampled verify with q rows in the host face (q_rows %s): got %s" % (field, h))
        print("q_rows slab: sampled verify refused (unavailable, naming shm_staging), greedy served; "
              "q_rows host_face and absent: sampled verify served")
    finally:
        for b in buffers:
            b.close()


if __name__ == "__main__":
    main(test)
