#!/usr/bin/env python3
"""make_seeds.py: writes the seed corpora of tests/fuzz/corpus/ (small valid
and near-valid inputs for every target). Deterministic; run it again after
changing a format, then commit what changed. The tokenizer seeds and
tests/fuzz/data/tiny_tokenizer.json come from tandem-make-model's tiny
tokenizer (see docs/fuzzing.md), not from this script.

    tests/fuzz/make_seeds.py [CORPUS_DIR]
"""
import json
import os
import struct
import sys

root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")


def put(target, name, data):
    d = os.path.join(root, target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def safetensors(tensors, metadata=True, pad=True, raw_header=None, truncate=None):
    """tensors: list of (name, dtype, shape); data laid out back to back."""
    header, data, off = {}, b"", 0
    if metadata:
        header["__metadata__"] = {"format": "pt"}
    size = {"F32": 4, "F16": 2, "BF16": 2}
    for name, dtype, shape in tensors:
        n = size.get(dtype, 4)
        for e in shape:
            n *= e
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + n]}
        data += bytes((off + i) % 251 for i in range(n))
        off += n
    h = raw_header if raw_header is not None else json.dumps(header, separators=(",", ":")).encode()
    if pad:
        h += b" " * ((8 - len(h) % 8) % 8)
    out = struct.pack("<Q", len(h)) + h + data
    return out[:truncate] if truncate is not None else out


# ---- safetensors: one file
T2 = [("model.norm.weight", "F32", [4]), ("w", "BF16", [2, 3])]
put("safetensors", "valid_two", safetensors(T2))
put("safetensors", "valid_f16_4d", safetensors([("x", "F16", [1, 2, 1, 2])]))
put("safetensors", "valid_empty_tensor", safetensors([("e", "F32", [0, 3]), ("s", "F32", [])]))
put("safetensors", "no_metadata", safetensors(T2, metadata=False, pad=False))
put("safetensors", "truncated_data", safetensors(T2, truncate=60))
put("safetensors", "bad_dtype", safetensors([("i", "I64", [2])]))
put("safetensors", "overlap", safetensors([], raw_header=json.dumps(
    {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
     "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}).encode()) + bytes(16))
put("safetensors", "header_len_huge", struct.pack("<Q", 1 << 40) + b"{}")
put("safetensors", "empty_header", struct.pack("<Q", 2) + b"{}")

# ---- safetensors index: index json, then shards a/b/c separated by the marker
SEP = b"\n--shard--\n"
idx = {"metadata": {"total_size": 40},
       "weight_map": {"model.norm.weight": "a.safetensors", "w": "b.safetensors"}}
put("safetensors_index", "valid_two_shards",
    json.dumps(idx).encode() + SEP + safetensors([T2[0]]) + SEP + safetensors([T2[1]]))
put("safetensors_index", "missing_tensor",
    json.dumps({"weight_map": {"x": "a.safetensors"}}).encode() + SEP + safetensors([T2[0]]))
put("safetensors_index", "duplicate_across_shards",
    json.dumps({"weight_map": {"w": "a.safetensors"}}).encode() + SEP + safetensors([T2[1]]) +
    SEP + safetensors([T2[1]]))
put("safetensors_index", "bad_shard_name",
    json.dumps({"weight_map": {"w": "../a.safetensors"}}).encode())
put("safetensors_index", "shard_absent",
    json.dumps({"weight_map": {"w": "c.safetensors"}}).encode() + SEP + safetensors([T2[1]]))

# ---- config.json
cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
       "vocab_size": 300, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
       "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16,
       "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
       "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                        "original_max_position_embeddings": 8192, "rope_type": "llama3"},
       "tie_word_embeddings": True, "bos_token_id": 284, "eos_token_id": [285, 292, 293],
       "attention_bias": False, "mlp_bias": False, "torch_dtype": "bfloat16"}
put("model_config", "tiny_llama3", json.dumps(cfg, indent=2))
c = dict(cfg); del c["rope_scaling"]; del c["head_dim"]; c["eos_token_id"] = 285
put("model_config", "no_scaling_int_eos", json.dumps(c))
c = dict(cfg); c["num_key_value_heads"] = 3
put("model_config", "bad_kv_heads", json.dumps(c))
c = dict(cfg); c["hidden_act"] = "gelu"
put("model_config", "bad_act", json.dumps(c))
c = dict(cfg); c["bos_token_id"] = 300
put("model_config", "bos_out_of_range", json.dumps(c))
put("model_config", "minimal", json.dumps({"vocab_size": 8, "hidden_size": 4, "intermediate_size": 8,
                                           "num_hidden_layers": 1, "num_attention_heads": 1}))

# ---- client requests
G = {"v": 1, "type": "generate"}
def req(name, **fields):
    put("request", name, json.dumps({**G, **fields}))
req("prompt", id="a1", prompt="Hello")
req("all_fields", id="x", prompt_ids=[1, 2, 300], max_tokens=7, temperature=0.5, top_k=40,
    top_p=0.9, min_p=0.05, seed=42, stop=["\n\n", "END"], stream=True, spec_k=4,
    spec_mode="point_mass")
req("messages", messages=[{"role": "system", "content": "Be brief."},
                          {"role": "user", "content": "Hi"}], temperature=0)
req("seed_string", prompt="x", seed="18446744073709551615")
req("seed_too_big", prompt="x", seed="18446744073709551616")
req("stop_many", prompt="x", stop=["a", "b", "c", "d", "e", "f", "g", "h", "i"])
req("unknown_field", prompt="x", colour="blue")
put("request", "stats", json.dumps({"v": 1, "type": "stats", "id": "s"}))
put("request", "not_json", '{"v":1,"type":"generate","prompt":"x"')
put("request", "utf8_prompt", json.dumps({**G, "prompt": "caf\u00e9 \U0001F600 \\u0000"}, ensure_ascii=False))

# ---- worker messages: shape byte, u16 header length, header, token frame
def wmsg(name, header, tokens=None, shape=None):
    h = json.dumps({"v": 1, **header}, separators=(",", ":")).encode()
    frame = b"".join(struct.pack("<i", t) for t in tokens) if tokens is not None else b""
    if shape is None:
        shape = 1 if tokens is not None else 0
    put("worker_msg", name, bytes([shape]) + struct.pack("<H", len(h)) + h + frame)
S = {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.0, "seed": "12345678901234567"}
wmsg("prefill", {"type": "prefill", "req": 7, "slot": 1, "sampling": S, "mode": "sampled"}, [1, 2, 3])
wmsg("prefill_done", {"type": "prefill_done", "req": 7, "slot": 1, "prefill_ms": 1.5})
wmsg("draft", {"type": "draft", "req": 7, "slot": 1, "half": 0, "round": 3, "keep_len": 4, "k": 4,
               "predraft_k": 2, "sampling": S, "mode": "point_mass"}, [5])
wmsg("draft_ready", {"type": "draft_ready", "req": 7, "slot": 1, "half": 1, "round": 3, "k": 4,
                     "guess": 9, "predraft": True, "draft_ms": 0.25})
wmsg("verify", {"type": "verify", "req": 7, "slot": 1, "round": 3, "keep_len": 4, "k": 2, "half": 0,
                "sampling": S, "shm": {"name": "/tandem-x-1-draft"}}, [5, 6])
wmsg("verify_done", {"type": "verify_done", "req": 7, "slot": 1, "round": 3, "n_accepted": 2,
                     "verify_ms": 2.0, "idle_ms": -1, "draft_k": 4}, [10, 11, 12])
wmsg("release", {"type": "release", "req": 7, "slot": 1})
wmsg("error", {"type": "error", "req": 7, "slot": 1, "code": "invalid_arg", "message": "bad",
               "in_reply_to": "draft"})
wmsg("register", {"type": "register", "role": "draft", "pid": 4242, "model": "/m/d", "backend": "cpu",
                  "vocab_size": 512, "eos_ids": [497, 504], "max_seq_len": 64, "n_slots": 4,
                  "bos_id": 496, "shm": {"name": "/tandem-x-4242-draft"}})
wmsg("run", {"type": "run", "req": 7, "slot": 1, "round": 3, "keep_len": 4, "sampling": S, "steps": 17,
             "logprobs": 2}, [5])
wmsg("verify_matched", {"type": "verify_matched", "req": 7, "slot": 1, "round": 3, "keep_len": 4,
                        "sampling": S, "drafts": [8, 9, 10]}, [5])
wmsg("verify_tree", {"type": "verify_tree", "req": 7, "slot": 1, "round": 3, "keep_len": 4,
                     "sampling": S, "drafts": [8, 9, 10, 11], "parents": [-1, 0, -1, 2]}, [5])
wmsg("prefill_target", {"type": "prefill", "req": 7, "slot": 1, "round": 1, "sampling": S, "logprobs": 0},
     [1, 2, 3])
wmsg("verify_beside", {"type": "verify", "req": 7, "slot": 1, "round": 3, "keep_len": 4, "k": 2, "half": 0,
                       "sampling": S, "await_draft": True}, [5])
wmsg("verify_done_step", {"type": "verify_done", "req": 7, "slot": 1, "round": 3, "n_accepted": 0,
                          "verify_ms": 2.0, "draft_k": 0, "step": 5}, [10])
wmsg("register_cpu", {"type": "register", "role": "target", "pid": 4243, "model": "/m/t", "backend": "cpu",
                      "vocab_size": 512, "eos_ids": [497], "max_seq_len": 64, "n_slots": 4, "bos_id": -1,
                      "cpu": {"host": "0f2c9a52-5c4e-4b0e-9d1e-2a6e0c1b7f33", "threads": 2,
                              "cpus": "0-3,8"}})
wmsg("verify_done_odd_frame", {"type": "verify_done", "req": 7, "slot": 1, "round": 3,
                               "n_accepted": 0, "verify_ms": 2.0, "draft_k": 0}, [1], shape=3)
put("worker_msg", "verify_done_frame_not_int32",
    bytes([1]) + struct.pack("<H", 20) + b'{"v":1,"type":"x"}  ' + b"\x01\x02\x03")

# ---- process config
put("proc_config", "full", json.dumps({
    "instance": "blue",
    "coordinator": {"max_concurrency": 3, "spec_mode": "point_mass", "client_endpoint": "tcp://*:6000",
                    "max_queue": 4, "heartbeat_ms": 100, "spec_k_max": 8, "log_level": "debug"},
    "draft_worker": {"model": "/d", "device": 0, "threads": 2},
    "target_worker": {"model": "/t", "backend": "cuda", "device": "GPU-1234-abcd",
                      "coordinator_endpoint": "ipc:///tmp/x"}}, indent=1))
put("proc_config", "empty_object", "{}")
put("proc_config", "unknown_key", json.dumps({"coordinator": {"foo": 1}}))
put("proc_config", "bad_endpoint", json.dumps({"coordinator": {"client_endpoint": "tcp://host:99999"},
                                               "draft_worker": {"model": "/d"},
                                               "target_worker": {"model": "/t"}}))
put("proc_config", "long_instance", json.dumps({"instance": "x" * 70}))

# ---- HTTP request bodies (gateway/openai.c): both endpoints' shapes
M = "tandem-fuzz"
CHAT = {"model": M, "messages": [{"role": "system", "content": "Be brief."},
                                 {"role": "user", "content": "Hello there"}]}
put("openai", "chat_min", json.dumps({"model": M, "messages": [{"role": "user", "content": "hi"}]}))
put("openai", "chat_all", json.dumps({**CHAT, "max_completion_tokens": 8, "max_tokens": 4, "temperature": 0.7,
                                      "top_p": 0.9, "seed": 7, "stop": ["\n", "end"], "stream": True,
                                      "stream_options": {"include_usage": True}, "n": 1, "logprobs": False,
                                      "user": "u", "frequency_penalty": 0, "presence_penalty": 0}))
put("openai", "chat_parts", json.dumps({"model": M, "messages": [
    {"role": "user", "content": [{"type": "text", "text": "caf\u00e9 "}, {"type": "text", "text": "\U0001F600"}]}]},
    ensure_ascii=False))
put("openai", "chat_tools", json.dumps({**CHAT, "tools": [{"type": "function"}]}))
put("openai", "chat_bad_role", json.dumps({"model": M, "messages": [{"role": "wizard", "content": "x"}]}))
put("openai", "stream_options_unknown", json.dumps({**CHAT, "stream": True, "stream_options": {"\u00e9" * 40: 1}},
                                                   ensure_ascii=False))
put("openai", "completion", json.dumps({"model": M, "prompt": "Once upon a time", "max_tokens": 5,
                                        "stop": "\n", "echo": False, "temperature": 0}))
put("openai", "completion_ids", json.dumps({"model": M, "prompt": [1, 2, 3]}))
put("openai", "wrong_model", json.dumps({"model": "gpt-4", "prompt": "x"}))
put("openai", "not_json", '{"model": "tandem-fuzz", "messages": [')
put("openai", "duplicate_key", '{"model":"tandem-fuzz","prompt":"a","prompt":"b"}')


# lane: one datagram of common/wire/lane.c: prefix {magic "TLN1", header
# bytes, frame count, four frame sizes} (little-endian u32), header, frames.
def lane(header, frames=(), magic=0x314E4C54, count=None, sizes=None):
    h = header.encode() if isinstance(header, str) else header
    n = len(frames) if count is None else count
    fs = list(sizes) if sizes is not None else [len(f) for f in frames]
    fs += [0] * (4 - len(fs))
    return struct.pack("<7I", magic, len(h), n, *fs[:4]) + h + b"".join(frames)


put("lane", "hello", lane('{"v":1,"type":"lane","key":"0123456789abcdef0123456789abcdef"}'))
put("lane", "verify_frames", lane('{"v":1,"type":"verify","req":7,"slot":0,"round":3,"half":1,"k":2}',
                                  [struct.pack("<3i", 11, 22, 33), b""]))
put("lane", "heartbeat", lane('{"v":1,"type":"heartbeat","role":"draft"}'))
put("lane", "bad_magic", lane('{"v":1,"type":"x"}', magic=0x12345678))
put("lane", "short_count", lane('{"v":1,"type":"x"}', [b"abcd"], sizes=[9]))
put("lane", "five_frames", lane('{"v":1,"type":"x"}', count=5))
put("lane", "no_v", lane('{"type":"x"}'))
