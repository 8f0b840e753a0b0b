"""A Llama 3 model in plain PyTorch, with HuggingFace's tensor names and conventions.

RMSNorm, RoPE in the rotate_half layout with Llama 3 frequency scaling
(rope_scaling type llama3), grouped-query attention, SwiGLU MLP, tied input
and output embeddings. Parameter names are those of transformers'
LlamaForCausalLM, so state_dict() is what safetensors holds and what Tandem's
loader (common/model/llama.c) maps.
"""
import json
import math
import os
import struct

import torch
import torch.nn as nn
import torch.nn.functional as F


def rope_inv_freq(cfg):
    """Inverse frequencies as transformers' _compute_llama3_parameters computes them."""
    hd = cfg["head_dim"]
    inv = [cfg["rope_theta"] ** (-(2 * j) / hd) for j in range(hd // 2)]
    rs = cfg.get("rope_scaling")
    if rs and rs.get("rope_type") == "llama3":
        orig, low, high = rs["original_max_position_embeddings"], rs["low_freq_factor"], rs["high_freq_factor"]
        out = []
        for f in inv:
            wavelen = 2 * math.pi / f
            if wavelen < orig / high:
                out.append(f)
            elif wavelen > orig / low:
                out.append(f / rs["factor"])
            else:
                s = (orig / wavelen - low) / (high - low)
                out.append((1 - s) * f / rs["factor"] + s * f)
        inv = out
    return torch.tensor(inv, dtype=torch.float32)


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


class Attention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        d, hd = cfg["hidden_size"], cfg["head_dim"]
        self.nh, self.nkv, self.hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], hd
        self.q_proj = nn.Linear(d, self.nh * hd, bias=False)
        self.k_proj = nn.Linear(d, self.nkv * hd, bias=False)
        self.v_proj = nn.Linear(d, self.nkv * hd, bias=False)
        self.o_proj = nn.Linear(self.nh * hd, d, bias=False)

    def forward(self, x, cos, sin):
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.nh, self.hd).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.nkv, self.hd).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.nkv, self.hd).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        rep = self.nh // self.nkv
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        # PyTorch 1.13 (Debian 12) has no scaled_dot_product_attention
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(self.hd))
        mask = torch.ones(t, t, dtype=torch.bool).triu(1)
        y = att.masked_fill(mask, float("-inf")).softmax(-1) @ v
        return self.o_proj(y.transpose(1, 2).reshape(b, t, self.nh * self.hd))


class MLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        d, ff = cfg["hidden_size"], cfg["intermediate_size"]
        self.gate_proj = nn.Linear(d, ff, bias=False)
        self.up_proj = nn.Linear(d, ff, bias=False)
        self.down_proj = nn.Linear(ff, d, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"])
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"])
        self.mlp = MLP(cfg)

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class Inner(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg["vocab_size"], cfg["hidden_size"])
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg["num_hidden_layers"]))
        self.norm = RMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"])


class Llama(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.model = Inner(cfg)
        self.register_buffer("inv_freq", rope_inv_freq(cfg), persistent=False)
        std = 0.02
        for name, p in self.named_parameters():
            if p.dim() == 2:
                # GPT-2's scaled init on the projections that write the residual
                s = std / math.sqrt(2 * cfg["num_hidden_layers"]) if name.endswith(("o_proj.weight", "down_proj.weight")) else std
                nn.init.normal_(p, 0.0, s)

    def hidden(self, ids):
        """The final norm's output at every position (what the head multiplies)."""
        t = ids.shape[1]
        pos = torch.arange(t, dtype=torch.float32)
        freqs = torch.outer(pos, self.inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos()[None, None], emb.sin()[None, None]
        x = self.model.embed_tokens(ids)
        for layer in self.model.layers:
            x = layer(x, cos, sin)
        return self.model.norm(x)

    def forward(self, ids):
        return self.hidden(ids) @ self.model.embed_tokens.weight.t()  # tied output embedding


def n_params(model):
    return sum(p.numel() for p in model.parameters())


def hf_config(shape, vocab_size, bos_id, eos_ids, max_positions, rope_scaling):
    cfg = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "attention_bias": False, "mlp_bias": False, "hidden_act": "silu",
        "bos_token_id": bos_id, "eos_token_id": eos_ids,
        "hidden_size": shape["hidden_size"], "intermediate_size": shape["intermediate_size"],
        "num_hidden_layers": shape["num_hidden_layers"],
        "num_attention_heads": shape["num_attention_heads"],
        "num_key_value_heads": shape["num_key_value_heads"],
        "head_dim": shape["hidden_size"] // shape["num_attention_heads"],
        "max_position_embeddings": max_positions, "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0, "rope_scaling": rope_scaling,
        "tie_word_embeddings": True, "torch_dtype": "bfloat16", "vocab_size": vocab_size,
    }
    return cfg


def save_safetensors(path, tensors, metadata=None):
    """Writes tensors (name -> bf16 tensor) as one safetensors file, names sorted."""
    header, blobs, off = {}, [], 0
    for name in sorted(tensors):
        t = tensors[name].detach().contiguous()
        assert t.dtype == torch.bfloat16
        raw = t.view(torch.int16).numpy().tobytes()
        header[name] = {"dtype": "BF16", "shape": list(t.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    if metadata:
        header["__metadata__"] = metadata
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def load_safetensors(path):
    """Reads a bf16 safetensors file written by save_safetensors (name -> float32 tensor)."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, h in header.items():
        if name == "__metadata__":
            continue
        if h["dtype"] != "BF16":
            raise ValueError(f"{path}: tensor {name}: dtype {h['dtype']}, expected BF16")
        a, b = h["data_offsets"]
        t = torch.frombuffer(bytearray(data[a:b]), dtype=torch.int16).view(torch.bfloat16)
        out[name] = t.reshape(h["shape"]).float()
    return out


def export(model, out_dir, cfg):
    """config.json + model.safetensors (bf16; the tied output embedding is not stored)."""
    os.makedirs(out_dir, exist_ok=True)
    sd = {k: v.to(torch.bfloat16) for k, v in model.state_dict().items()}
    save_safetensors(os.path.join(out_dir, "model.safetensors"), sd, {"format": "pt"})
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")


def load(model_dir):
    """A model from a directory written by export, weights rounded to bf16 as stored."""
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    m = Llama(cfg)
    m.load_state_dict(load_safetensors(os.path.join(model_dir, "model.safetensors")))
    return m.eval()
