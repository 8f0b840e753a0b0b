#!/usr/bin/python3
"""Coordinator, draft and target as three hosts: each in a network
namespace of its own (veth pairs to the coordinator's, made and removed
here) with a /dev/shm of its own, talking over tcp. The workers' shm
domains differ, so the coordinator has every published half travel in the
draft's draft_ready and the target's verify ("frames", docs/scale-out.md).
The worker endpoint is CURVE with the workers' keys listed
(coordinator.worker_curve_keys_file); a worker with another key is refused
in the handshake and never registers. Checked: greedy output equals
target-only; a seeded sampled request (q rows
crossing, K fixed) equals the same request on a pipeline sharing memory, bit
for bit; the drafts were used (acceptance > 0); kill -9 of the draft's host
process leaves the request finishing target-only with the same ids.
Needs root, ip(8) and unshare(1): skipped with a line saying so otherwise."""
import json
import os
import shutil
import signal
import subprocess
import sys
import time

from tandem_e2e import Pipeline, binary, check, collect, generate, main, next_event, reference, run as run_cmd

PORT = 5601
NET = {"draft": "10.77.1", "target": "10.77.2"}


def sh(*cmd):
    r = subprocess.run(list(cmd), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        raise RuntimeError("%s: %s" % (" ".join(cmd), r.stderr.strip()))


class Hosts:
    """Three namespaces: coordinator <-> draft, coordinator <-> target."""

    def __init__(self):
        tag = "%d" % (os.getpid() % 100000)
        self.ns = {role: "tnd%s%s" % (role[0], tag) for role in ("coordinator", "draft", "target")}
        self.made = []
        try:
            for role, ns in self.ns.items():
                sh("ip", "netns", "add", ns)
                self.made.append(ns)
                sh("ip", "-n", ns, "link", "set", "lo", "up")
            for role in ("draft", "target"):
                near, far = "tv%s%s0" % (role[0], tag), "tv%s%s1" % (role[0], tag)
                sh("ip", "link", "add", near, "type", "veth", "peer", "name", far)
                sh("ip", "link", "set", near, "netns", self.ns["coordinator"])
                sh("ip", "link", "set", far, "netns", self.ns[role])
                sh("ip", "-n", self.ns["coordinator"], "addr", "add", NET[role] + ".1/24", "dev", near)
                sh("ip", "-n", self.ns[role], "addr", "add", NET[role] + ".2/24", "dev", far)
                sh("ip", "-n", self.ns["coordinator"], "link", "set", near, "up")
                sh("ip", "-n", self.ns[role], "link", "set", far, "up")
        except Exception:
            self.close()
            raise

    def wrap(self, role):
        """A process on that host: its namespace and a /dev/shm of its own."""
        return ["ip", "netns", "exec", self.ns[role], "unshare", "-m", "sh", "-c",
                'mount -t tmpfs -o size=512m tmpfs /dev/shm && exec "$0" "$@"']

    def close(self):
        for ns in self.made:
            subprocess.run(["ip", "netns", "del", ns], stderr=subprocess.DEVNULL)
        self.made = []


def can_make_hosts():
    if os.geteuid() != 0:
        return "needs root to create network namespaces"
    if not shutil.which("ip") or not shutil.which("unshare"):
        return "needs ip(8) and unshare(1)"
    probe = "tndprobe%d" % (os.getpid() % 100000)
    r = subprocess.run(["ip", "netns", "add", probe], stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        return "cannot create a network namespace here: %s" % r.stderr.strip()
    r = subprocess.run(["ip", "netns", "exec", probe, "unshare", "-m", "sh", "-c",
                        "mount -t tmpfs tmpfs /dev/shm"], stderr=subprocess.PIPE, text=True)
    veth = subprocess.run(["ip", "-n", probe, "link", "add", "tndpa", "type", "veth", "peer", "name", "tndpb"],
                          stderr=subprocess.PIPE, text=True)
    subprocess.run(["ip", "netns", "del", probe], stderr=subprocess.DEVNULL)
    if r.returncode != 0:
        return "cannot mount a /dev/shm of its own in a namespace: %s" % r.stderr.strip()
    if veth.returncode != 0:
        return "cannot create a veth pair: %s" % veth.stderr.strip()
    return None


def sampled_request(rid):
    return {"id": rid, "prompt_ids": [3, 14, 15, 92, 65], "max_tokens": 64, "temperature": 0.9, "top_k": 40,
            "seed": 777, "spec_k": 3}


def test():
    why = can_make_hosts()
    if why:
        # not tandem_e2e.skip: a CI runner without namespaces is no missing dependency
        print("three hosts in network namespaces: %s: skipped" % why)
        sys.exit(77)
    hosts = Hosts()
    try:
        run(hosts)
    finally:
        hosts.close()


def keygen(d, name):
    prefix = os.path.join(d, name)
    run_cmd([binary("keygen"), prefix])
    return prefix + ".key", prefix + ".pub"


def curve_config(p):
    """The worker endpoint as a CURVE server admitting the two workers' keys."""
    server_key, server_pub = keygen(p.dir, "workers-endpoint")
    listed = os.path.join(p.dir, "worker-keys")
    with open(listed, "w") as f:
        for role in ("draft", "target"):
            key, pub = keygen(p.dir, role)
            p.config["%s_worker" % role].update({"coordinator_curve_public_key_file": server_pub,
                                                 "curve_secret_key_file": key})
            f.write(open(pub).read())
    p.config["coordinator"].update({"worker_curve_secret_key_file": server_key, "worker_curve_keys_file": listed})
    return server_pub


def run(hosts):
    p = Pipeline("hosts", worker_timeout_ms=1500)
    draft, target = p.make_pair()
    p.config["coordinator"].update({"worker_endpoint": "tcp://*:%d" % PORT, "external_workers": 1})
    for role in ("draft", "target"):
        p.config["%s_worker" % role]["coordinator_endpoint"] = "tcp://%s.1:%d" % (NET[role], PORT)
    server_pub = curve_config(p)
    for role in ("coordinator", "draft", "target"):
        p.wrap[role] = hosts.wrap(role)
    p.start_all()
    with open(p.logs["coordinator"]) as f:
        log = f.read()
    check("share no memory" in log, "the coordinator did not choose frames:\n%s" % log[-2000:])

    s = p.client()
    ids = [11, 22, 33, 44, 55]
    ref = reference(target, ids, 96)["ids"]
    done, _ = generate(s, {"id": "greedy", "prompt_ids": ids, "max_tokens": 96, "temperature": 0, "spec_k": 3})
    check(done.get("ids") == ref, "greedy over three hosts differs from target-only: %s" % done)
    done_s, _ = generate(s, sampled_request("sampled"))
    check(done_s.get("type") == "done", "sampled over three hosts: %s" % done_s)
    spec = p.stats()["spec"]
    check(spec["num_draft_tokens"] > 0 and spec["num_accepted_tokens"] > 0,
          "the drafts were not used over three hosts: %s" % spec)

    # a worker whose key is not listed: refused in the handshake, never registered
    registrations = p.stats()["workers"]["draft"]["registrations"]
    stranger_key, _ = keygen(p.dir, "stranger")
    cfg = json.loads(json.dumps(p.config))
    cfg["draft_worker"]["curve_secret_key_file"] = stranger_key
    stranger_cfg = os.path.join(p.dir, "stranger.json")
    with open(stranger_cfg, "w") as f:
        json.dump(cfg, f)
    stranger = subprocess.Popen(hosts.wrap("draft") + [binary("draft"), "--config", stranger_cfg],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 15
    refused = False
    while time.time() < deadline and not refused:
        with open(p.logs["coordinator"]) as f:
            refused = "refused a worker connection" in f.read()
        time.sleep(0.2)
    stranger.kill()
    stranger.wait()
    check(refused, "a worker with an unlisted key was not refused:\n%s" % open(p.logs["coordinator"]).read()[:3000])
    check(p.stats()["workers"]["draft"]["registrations"] == registrations,
          "a worker with an unlisted key registered")

    # kill -9 of the draft's host process: the request finishes target-only
    n = 3000
    ref_long = reference(target, [7, 8, 9], n)["ids"]
    s.send_json({"v": 1, "type": "generate", "id": "long", "prompt_ids": [7, 8, 9], "max_tokens": n,
                 "temperature": 0, "stream": True})
    first = next_event(s, "long")
    check(first["type"] == "token", "long request: %s" % first)
    p.kill("draft", signal.SIGKILL)
    done_l, _ = collect(s, "long", 120)
    check(done_l.get("ids") == ref_long, "after the draft's host died: %s" % str(done_l)[:300])
    s.close()
    accepted = spec["num_accepted_tokens"]
    for role in list(p.procs):
        p.kill(role)  # the models stay (p.dir) for the second pipeline

    # the same sampled request on a pipeline sharing memory: the same ids
    q = Pipeline("hostsref", worker_timeout_ms=1500)
    q.config["draft_worker"]["model"], q.config["target_worker"]["model"] = draft, target
    q.start_all()
    s = q.client()
    done_r, _ = generate(s, sampled_request("sampled"))
    s.close()
    check(done_r.get("ids") == done_s.get("ids"),
          "sampled output over three hosts differs from shared memory:\n%s\n%s" % (done_s.get("ids"),
                                                                                    done_r.get("ids")))
    q.close()
    p.close()
    print("three hosts over tcp: greedy = target-only, sampled = shared-memory run (%d tokens), %d drafts "
          "accepted; the draft's host killed mid-request: finished target-only" %
          (len(done_s["ids"]), accepted))


if __name__ == "__main__":
    main(test)
