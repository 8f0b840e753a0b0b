#!/usr/bin/env python3
"""bench_hf.py: HuggingFace transformers beside tandem-generate on one GPU, the
same weights, the same prompt ids, in one run.

    tools/bench/bench_hf.py --build DIR --target DIR --draft DIR
                            [--tokens N] [--device D] [--prompt-len N]

Prints, greedy decoding of --tokens tokens after a --prompt-len-token prompt:
  tokens/s of HF generate (bf16) target-only and assisted by the draft
  (assistant_model), of tandem-generate target-only and speculative (adaptive
  K); HF's the second of two runs, tandem-generate's after its own warm-up;
  how many leading tokens tandem-generate shares with HF in f32 (the same
  arithmetic as Tandem's f32 activations over bf16 weights, up to reduction
  order) and with HF in bf16 (its activations rounded to bf16).
A figure, not a test: random weights make near-ties, so agreement can end
early without a bug; it ending at the first token says something is wrong.

Where torch, transformers or a GPU is missing it prints "SKIP hf: <reason>"
(a SKIP row in tests/gpu/run_gpu_tests.sh) and exits 0.
"""
import argparse
import json
import os
import subprocess
import sys
import time


def tandem_generate(build, model, ids, tokens, device, draft=None):
    cmd = [os.path.join(build, "tools/generate/tandem-generate"), "--backend", "cuda",
           "--device", device, "--model", model, "--ids", ",".join(map(str, ids)),
           "--max-tokens", str(tokens), "--json"]
    if draft:
        cmd += ["--draft", draft, "--spec-k", "0"]
    # one run: tandem-generate warms its contexts up before it times anything
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        raise RuntimeError("%s failed (%d): %s" % (" ".join(cmd), out.returncode,
                                                   out.stderr.strip()[-400:]))
    return json.loads(out.stdout)


def hf_generate(torch, model, ids, tokens, assistant=None):
    x = torch.tensor([ids], device=model.device)
    kw = dict(max_new_tokens=tokens, do_sample=False, pad_token_id=0)
    if assistant is not None:
        kw["assistant_model"] = assistant
    best_tps, out_ids = 0.0, []
    for run in range(2):  # the first warms up (kernels, allocator)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = model.generate(x, **kw)
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        out_ids = out[0, len(ids):].tolist()
        if run > 0:
            best_tps = max(best_tps, len(out_ids) / dt)
    return best_tps, out_ids


def common_prefix(a, b):
    n = 0
    while n < len(a) and n < len(b) and a[n] == b[n]:
        n += 1
    return n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--target", required=True)
    ap.add_argument("--draft", required=True)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=16)
    ap.add_argument("--device", default="0")
    a = ap.parse_args()
    try:
        import torch
        import transformers
    except ImportError as e:
        print("SKIP hf: %s" % e)
        return 0
    if not torch.cuda.is_available():
        print("SKIP hf: torch sees no GPU")
        return 0
    with open(os.path.join(a.target, "config.json")) as f:
        vocab = json.load(f)["vocab_size"]
    ids = [(1000 + 7919 * i) % vocab for i in range(a.prompt_len)]
    dev = "cuda:%s" % a.device if a.device.isdigit() else "cuda"
    load = transformers.AutoModelForCausalLM.from_pretrained

    rows = []
    tan = tandem_generate(a.build, a.target, ids, a.tokens, a.device)
    tan_spec = tandem_generate(a.build, a.target, ids, a.tokens, a.device, draft=a.draft)
    rows.append(("tandem-generate, target only", tan["generated_tokens"], tan["tokens_per_s"]))
    rows.append(("tandem-generate, speculative (adaptive K)", tan_spec["generated_tokens"],
                 tan_spec["tokens_per_s"]))

    target = load(a.target, torch_dtype=torch.bfloat16).to(dev).eval()
    draft = load(a.draft, torch_dtype=torch.bfloat16).to(dev).eval()
    with torch.no_grad():
        tps, hf_bf16 = hf_generate(torch, target, ids, a.tokens)
        rows.append(("HF generate bf16, target only", len(hf_bf16), tps))
        tps, _ = hf_generate(torch, target, ids, a.tokens, assistant=draft)
        rows.append(("HF generate bf16, assisted by the draft", len(hf_bf16), tps))
    del target, draft
    torch.cuda.empty_cache()
    target32 = load(a.target, torch_dtype=torch.float32).to(dev).eval()
    with torch.no_grad():
        _, hf_f32 = hf_generate(torch, target32, ids, a.tokens)

    print("transformers %s, torch %s, %s" % (transformers.__version__, torch.__version__,
                                             torch.cuda.get_device_name(dev)))
    print("greedy, %d-token prompt, up to %d tokens (each after a warm-up)"
          % (a.prompt_len, a.tokens))
    print("  %-44s %7s %10s" % ("", "tokens", "tokens/s"))
    for name, n, tps in rows:
        print("  %-44s %7d %10.1f" % (name, n, tps))
    base = rows[2][2]
    print("  tandem target-only / HF target-only: %.2fx; tandem speculative / HF assisted: %.2fx"
          % (rows[0][2] / base, rows[1][2] / rows[3][2]))
    print("  leading tokens tandem shares with HF f32: %d of %d; with HF bf16: %d of %d"
          % (common_prefix(tan["ids"], hf_f32), len(tan["ids"]),
             common_prefix(tan["ids"], hf_bf16), len(tan["ids"])))
    print("  speculative tandem == target-only tandem: %s"
          % ("yes" if tan_spec["ids"] == tan["ids"] else "NO"))
    return 0 if tan_spec["ids"] == tan["ids"] else 1


if __name__ == "__main__":
    sys.exit(main())
