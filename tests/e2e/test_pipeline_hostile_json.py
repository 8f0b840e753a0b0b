#!/usr/bin/python3
"""Trust under attack (issue 15, defects 2-4): every reply is valid UTF-8
JSON whatever bytes a client sends; values the protocol documents as valid
are served, not failed with `internal`; what the workers would refuse is
refused up front with `invalid_request`; cJSON's lenience (keys given twice,
\\u0000, raw control characters, invalid UTF-8) never reaches a request."""
import json

from tandem_e2e import Fail, Pipeline, check, collect, main


def send_raw(sock, raw, timeout_s=20):
    """Sends bytes, returns the reply parsed from strictly decoded UTF-8."""
    sock.send(raw)
    check(sock.poll(timeout_s * 1000), "no reply to %r" % raw[:200])
    data = sock.recv()
    try:
        text = data.decode("utf-8")  # strict: raises on invalid UTF-8
    except UnicodeDecodeError as e:
        raise Fail("reply to %r is not valid UTF-8 (%s): %r" % (raw[:120], e, data[:300]))
    return json.loads(text)


def expect(sock, raw, code, needle, rid=""):
    m = send_raw(sock, raw)
    check(m.get("type") == "error" and m.get("code") == code,
          "expected %s for %r, got %s" % (code, raw[:200], m))
    check(needle in m.get("message", ""), "message %r lacks %r" % (m.get("message"), needle))
    check(rid is None or m.get("id") == rid, "reply id %r, expected %r" % (m.get("id"), rid))
    return m


def test():
    p = Pipeline("hostile")
    p.make_pair()
    p.start_all()
    s = p.client()
    g = b'{"v":1,"type":"generate","prompt_ids":[5,6,7],"max_tokens":4,"temperature":0'
    e = "\u00e9".encode()  # 2 bytes: odd cuts land inside it

    # Invalid UTF-8 in an id, a field name, a value: refused, reply valid, no raw echo.
    expect(s, b'{"v":1,"type":"generate","id":"\xc3","prompt_ids":[1]}', "invalid_request", "invalid UTF-8")
    expect(s, b'{"v":1,"type":"stats","id":"\xff\xfe"}', "invalid_request", "invalid UTF-8")
    expect(s, g + b',"\xe9t\xe9":1}', "invalid_request", "invalid UTF-8")
    # Long multi-byte field names and values are quoted cut at a character boundary.
    expect(s, g + b',"id":"x","a' + e * 100 + b'":1}', "invalid_request", "unknown field", "x")
    expect(s, g + b',"id":"x","spec_mode":"a' + e * 100 + b'"}', "invalid_request", "spec_mode", "x")
    expect(s, g + b',"id":"x","seed":"a' + e * 100 + b'"}', "invalid_request", "seed", "x")
    expect(s, b'{"v":1,"type":"a' + e * 100 + b'"}', "invalid_request", "unknown message type")
    expect(s, g + b',"id":"x","messages":[{"role":"u","content":"c","a' + e * 100 + b'":1}]}',
           "invalid_request", "", "x")
    # A valid multi-byte id is echoed intact in error, token, done and stats replies.
    rid = "r\u00e9q-\U0001F600"
    m = send_raw(s, json.dumps({"v": 1, "type": "stats", "id": rid}).encode())
    check(m.get("type") == "stats" and m.get("id") == rid, "stats id: %s" % m.get("id"))
    s.send(g + b',"stream":true,"id":' + json.dumps(rid).encode() + b'}')
    done, tokens = collect(s, rid, 60)
    check(done["type"] == "done" and all(t["id"] == rid for t in tokens), "multi-byte id: %s" % done)

    # Strict JSON: keys twice (at any depth), \u0000, raw control characters and NULs.
    expect(s, g + b',"id":"d","max_tokens":5}', "invalid_request", "max_tokens: given more than once", "d")
    expect(s, b'{"v":1,"type":"generate","id":"d","messages":[{"role":"user","content":"a","role":"system"}]}',
           "invalid_request", "messages[0].role: given more than once", "d")
    expect(s, b'{"v":1,"type":"generate","id":"z","prompt":"ab\\u0000cd"}', "invalid_request",
           "\\u0000 in a string: NUL characters are not accepted", "z")
    expect(s, b'{"v":1,"type":"generate","id":"z","prompt":"a\x01b"}', "invalid_request",
           "raw control character 0x01", "z")
    expect(s, b'{"v":1,"type":"generate","id":"z","prompt":"a\x00b"}', "invalid_request",
           "raw control character 0x00", None)

    # Documented-valid sampling values run; what the workers would refuse is refused here.
    for extra in (b',"temperature":1e6', b',"top_k":1073741824', b',"top_p":1e-40', b',"min_p":1e-50'):
        m = send_raw(s, b'{"v":1,"type":"generate","id":"v","prompt_ids":[5,6,7],"max_tokens":4,"seed":1'
                     + extra + b'}', 60)
        check(m["type"] == "done", "%s: %s" % (extra, m))
    for extra, needle in ((b',"temperature":1000001', "temperature: must be in [0, 1e+06]"),
                          (b',"top_k":1073741825', "top_k: must be <= 1073741824"),
                          (b',"top_p":1e-50', "top_p: 1e-50 is 0 as a 32-bit float")):
        expect(s, b'{"v":1,"type":"generate","id":"w","prompt_ids":[5,6,7],"max_tokens":4' + extra + b'}',
               "invalid_request", needle, "w")
    # spec_k above what the draft drafts per round (coordinator.spec_k_max, 8 by default).
    expect(s, g + b',"id":"k","spec_k":9}', "invalid_request", "spec_k: must be <= 8", "k")
    m = send_raw(s, g + b',"id":"k8","spec_k":8}', 60)
    check(m["type"] == "done" and m["spec"]["drafted"] > 0, "spec_k 8 should speculate: %s" % m)

    errors = p.stats()["requests"]["errors"]
    check(errors.get("internal", 0) == 0, "internal errors: %s" % errors)
    s.close()
    p.close()


if __name__ == "__main__":
    main(test)
