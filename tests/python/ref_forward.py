#!/usr/bin/env python3
"""Independent numpy reference forward for Llama-family models (float64).

Used to check wick on the real default model: weights are dequantized by the
`gguf` package, not by wick. The same forward is first checked against the HF
transformers logits in ../shared/fixtures/tiny-models/llama (safetensors, NeoX
RoPE) and on a GGUF copy (llama.cpp's interleaved q/k rows, GPT-J RoPE).

usage:
  ref_forward.py check-tiny FIXTURE_DIR [GGUF]        exit 1 if off
  ref_forward.py logits GGUF IDS OUT.f32              all positions, float32
"""
import json
import sys

import numpy as np


def load_safetensors(folder):
    from safetensors.numpy import load_file
    t = load_file(f"{folder}/model.safetensors")
    cfg = json.load(open(f"{folder}/config.json"))
    rp = cfg.get("rope_parameters") or dict(cfg.get("rope_scaling") or {},
                                            rope_theta=cfg.get("rope_theta", 10000.0))
    rp.setdefault("rope_type", rp.get("type", "default"))
    W = {"embd": t["model.embed_tokens.weight"], "norm": t["model.norm.weight"],
         "out": t.get("lm_head.weight", t["model.embed_tokens.weight"]), "layers": []}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        W["layers"].append({k: t[p + v] for k, v in dict(
            an="input_layernorm.weight", fn="post_attention_layernorm.weight",
            q="self_attn.q_proj.weight", k="self_attn.k_proj.weight", v="self_attn.v_proj.weight",
            o="self_attn.o_proj.weight", g="mlp.gate_proj.weight", u="mlp.up_proj.weight",
            d="mlp.down_proj.weight").items()})
    hp = dict(n_head=cfg["num_attention_heads"], n_head_kv=cfg["num_key_value_heads"],
              head_dim=cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"],
              eps=cfg["rms_norm_eps"], theta=rp["rope_theta"], interleaved=False, freq_factors=None)
    if rp.get("rope_type") == "llama3":
        hp["freq_factors"] = llama3_factors(hp["head_dim"], rp)
    elif rp.get("rope_type") == "yarn":
        hp["inv_freq"], hp["attn_factor"] = yarn_params(hp["head_dim"], rp, cfg["max_position_embeddings"])
    return W, hp


def yarn_params(hd, rp, max_pos):
    """transformers' YaRN: (inverse frequencies, attention factor on cos and sin)."""
    import math
    base, orig = rp["rope_theta"], rp.get("original_max_position_embeddings") or max_pos
    factor = rp.get("factor") or max_pos / orig
    mscale = lambda s, m=1.0: 1.0 if s <= 1 else 0.1 * m * math.log(s) + 1.0
    af = rp.get("attention_factor")
    if af is None:
        ms, ms_all = rp.get("mscale"), rp.get("mscale_all_dim")
        af = mscale(factor, ms) / mscale(factor, ms_all) if ms and ms_all else mscale(factor)
    beta_fast, beta_slow = rp.get("beta_fast") or 32, rp.get("beta_slow") or 1
    dim_at = lambda n_rot: hd * math.log(orig / (n_rot * 2 * math.pi)) / (2 * math.log(base))
    lo, hi = dim_at(beta_fast), dim_at(beta_slow)
    if rp.get("truncate", True):
        lo, hi = math.floor(lo), math.ceil(hi)
    lo, hi = max(lo, 0), min(hi, hd - 1)
    if lo == hi:
        hi += 0.001
    ext = 1 - np.clip((np.arange(hd // 2) - lo) / (hi - lo), 0, 1)
    pos_freqs = base ** (np.arange(0, hd, 2) / hd)
    inv = (1 / (factor * pos_freqs)) * (1 - ext) + (1 / pos_freqs) * ext
    return inv, af


def llama3_factors(hd, rp):
    inv = 1.0 / rp["rope_theta"] ** (np.arange(0, hd, 2) / hd)
    wl = 2 * np.pi / inv
    lo = rp["original_max_position_embeddings"] / rp["low_freq_factor"]
    hi = rp["original_max_position_embeddings"] / rp["high_freq_factor"]
    smooth = (rp["original_max_position_embeddings"] / wl - rp["low_freq_factor"]) / (
        rp["high_freq_factor"] - rp["low_freq_factor"])
    f = np.where(wl < hi, 1.0, np.where(wl > lo, rp["factor"], 1.0 / ((1 - smooth) / rp["factor"] + smooth)))
    return f


def load_gguf(path):
    import gguf
    r = gguf.GGUFReader(path)
    def val(key, default=None):
        f = r.fields.get(key)
        return default if f is None else f.contents()
    T = {}
    for t in r.tensors:
        a = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float64)
        T[t.name] = a.reshape([int(x) for x in reversed(t.shape)]) if a.ndim == 1 and len(t.shape) > 1 else a
    n_layer = val("llama.block_count")
    W = {"embd": T["token_embd.weight"], "norm": T["output_norm.weight"],
         "out": T.get("output.weight", T["token_embd.weight"]), "layers": []}
    for i in range(n_layer):
        p = f"blk.{i}."
        W["layers"].append({k: T[p + v] for k, v in dict(
            an="attn_norm.weight", fn="ffn_norm.weight", q="attn_q.weight", k="attn_k.weight",
            v="attn_v.weight", o="attn_output.weight", g="ffn_gate.weight", u="ffn_up.weight",
            d="ffn_down.weight").items()})
    n_head = val("llama.attention.head_count")
    hd = val("llama.attention.key_length", val("llama.embedding_length") // n_head)
    hp = dict(n_head=n_head, n_head_kv=val("llama.attention.head_count_kv", n_head), head_dim=hd,
              eps=val("llama.attention.layer_norm_rms_epsilon"), theta=val("llama.rope.freq_base", 10000.0),
              interleaved=True, freq_factors=T.get("rope_freqs.weight"))
    return W, hp


def rmsnorm(x, w, eps):
    return w * (x / np.sqrt((x * x).mean(-1, keepdims=True) + eps))


def rope(x, pos, hp):
    hd = hp["head_dim"]
    inv = 1.0 / hp["theta"] ** (np.arange(0, hd, 2) / hd)
    if hp["freq_factors"] is not None:
        inv = inv / np.asarray(hp["freq_factors"], dtype=np.float64)
    if hp.get("inv_freq") is not None:
        inv = hp["inv_freq"]
    ang = pos[:, None, None] * inv[None, None, :]
    af = hp.get("attn_factor", 1.0)  # YaRN scales cos and sin (transformers)
    c, s = np.cos(ang) * af, np.sin(ang) * af
    if hp["interleaved"]:  # pairs (2i, 2i+1)
        a, b = x[..., 0::2], x[..., 1::2]
        y = np.empty_like(x)
        y[..., 0::2], y[..., 1::2] = a * c - b * s, b * c + a * s
        return y
    a, b = x[..., : hd // 2], x[..., hd // 2:]
    return np.concatenate([a * c - b * s, b * c + a * s], -1)


def forward(W, hp, ids):
    ids = np.asarray(ids)
    T, H, KV, hd = len(ids), hp["n_head"], hp["n_head_kv"], hp["head_dim"]
    pos = np.arange(T, dtype=np.float64)
    x = W["embd"][ids].astype(np.float64)
    mask = np.triu(np.full((T, T), -np.inf), 1)
    for L in W["layers"]:
        h = rmsnorm(x, L["an"], hp["eps"])
        q = rope((h @ L["q"].T).reshape(T, H, hd), pos, hp)
        k = rope((h @ L["k"].T).reshape(T, KV, hd), pos, hp)
        v = (h @ L["v"].T).reshape(T, KV, hd)
        k, v = np.repeat(k, H // KV, 1), np.repeat(v, H // KV, 1)
        s = np.einsum("thd,shd->hts", q, k) / np.sqrt(hd) + mask
        p = np.exp(s - s.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        a = np.einsum("hts,shd->thd", p, v).reshape(T, H * hd)
        x = x + a @ L["o"].T
        h = rmsnorm(x, L["fn"], hp["eps"])
        g = h @ L["g"].T
        x = x + ((g / (1 + np.exp(-g))) * (h @ L["u"].T)) @ L["d"].T
    return rmsnorm(x, W["norm"], hp["eps"]) @ W["out"].T


def rel_err(a, b):
    return float(np.abs(a - b).max() / np.abs(b).max())


def main():
    if sys.argv[1] == "check-tiny":
        fix = sys.argv[2]
        ref = json.load(open(f"{fix}/reference.json"))
        models = [("safetensors", load_safetensors(fix))]
        if len(sys.argv) > 3:
            models.append(("gguf", load_gguf(sys.argv[3])))
        worst = 0.0
        for name, (W, hp) in models:
            for p in ref["prompts"]:
                exp = np.fromfile(f"{fix}/{p['logits']}", dtype=np.float32).reshape(p["logits_shape"])
                e = rel_err(forward(W, hp, p["ids"]), exp)
                worst = max(worst, e)
                print(f"numpy reference on tiny llama ({name}): rel err {e:.2e}")
        sys.exit(0 if worst < 1e-4 else 1)
    elif sys.argv[1] == "logits":
        W, hp = load_gguf(sys.argv[2])
        ids = [int(x) for x in sys.argv[3].split(",")]
        forward(W, hp, ids).astype(np.float32).tofile(sys.argv[4])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
