#!/usr/bin/python3
"""generate.py: the smallest Tandem client, in Python with pyzmq (Debian: python3-zmq).

    generate.py [--endpoint tcp://127.0.0.1:5555] [--max-tokens N] [--ids 1,2,3] [PROMPT]

Sends one streamed "generate" request to the coordinator, prints the text as
it arrives, then the finish reason, acceptance rate and tokens/s. With --ids
the prompt is token ids (for models without a tokenizer). See docs/protocol.md.
Exit status: 0 done, 1 error reply, 3 timeout or lost connection (the
coordinator died or restarted: the request died with it, send it again).
"""
import argparse
import json
import sys

import zmq
from zmq.utils.monitor import recv_monitor_message


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("prompt", nargs="?", default="Hello")
    ap.add_argument("--endpoint", default="tcp://127.0.0.1:5555")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--ids", help="comma-separated prompt token ids instead of text")
    ap.add_argument("--timeout-ms", type=int, default=60000)
    args = ap.parse_args()

    sock = zmq.Context.instance().socket(zmq.DEALER)  # one frame per message, no delimiter
    sock.setsockopt(zmq.LINGER, 0)
    # The coordinator keeps requests in memory only: if the connection drops
    # while ours runs, its replies will never come. ZeroMQ reconnects
    # silently; the monitor is how we hear of the drop.
    monitor = sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
    sock.connect(args.endpoint)
    poller = zmq.Poller()
    poller.register(sock, zmq.POLLIN)
    poller.register(monitor, zmq.POLLIN)

    request = {"v": 1, "type": "generate", "id": "example-1", "max_tokens": args.max_tokens,
               "temperature": args.temperature, "stream": True}
    if args.ids:
        request["prompt_ids"] = [int(x) for x in args.ids.split(",")]
    else:
        request["messages"] = [{"role": "user", "content": args.prompt}]
    sock.send_string(json.dumps(request))

    while True:
        ready = dict(poller.poll(args.timeout_ms))
        if not ready:
            print("no reply within %d ms" % args.timeout_ms, file=sys.stderr)
            return 3
        if sock not in ready:  # replies that came before a drop are read first
            if recv_monitor_message(monitor)["event"] == zmq.EVENT_DISCONNECTED:
                print("lost the connection to the coordinator; send the request again", file=sys.stderr)
                return 3
            continue
        reply = json.loads(sock.recv())
        if reply.get("id") != request["id"]:
            continue
        if reply["type"] == "token":          # one per accepted round
            sys.stdout.write(reply["text"])
            sys.stdout.flush()
        elif reply["type"] == "done":
            spec, timing = reply["spec"], reply["timing"]
            print()
            print("[%s; %d tokens; acceptance %.2f; %.1f tokens/s; ids %s]" %
                  (reply["finish_reason"], reply["usage"]["generated_tokens"], spec["acceptance_rate"],
                   timing["tokens_per_s"], reply["ids"]))
            return 0
        elif reply["type"] == "error":
            print("error %s: %s" % (reply["code"], reply["message"]), file=sys.stderr)
            return 1


if __name__ == "__main__":
    sys.exit(main())
