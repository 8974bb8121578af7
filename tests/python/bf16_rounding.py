#!/usr/bin/env python3
"""How far bf16 rounding moves the logits, in numpy (float64 otherwise).

Three forwards of the same weights: `exact` (f32/f64 activations: what the
fixtures' bf16w references are), `act` (the inputs of every matrix product
rounded to bf16, f32 accumulation: llama.cpp's and wick's default BF16 path)
and `torch` (every tensor stored in bf16 between ops, as transformers runs a
model loaded with torch_dtype=bfloat16). Evidence for the BF16 policy in
src/backend/cpu/packed.h (docs/perf.md, 2026-11-23).

usage:
  bf16_rounding.py tiny FIXTURE_DIR        (llama-family tiny fixture, bf16 weights)
  bf16_rounding.py real GGUF ID,ID,...      (KL and top-1 against `exact`)
"""
import sys, json, numpy as np
sys.path.insert(0, __import__("os").path.dirname(__file__))
import ref_forward as R

def bf16(a):
    a32 = np.asarray(a, dtype=np.float32)
    u = a32.view(np.uint32).astype(np.uint64)
    u = ((u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000).astype(np.uint32)
    return u.view(np.float32).astype(np.float64)

def forward(W, hp, ids, mode):
    # mode: "exact" | "act" (matmul inputs rounded to bf16, f32 accumulate: llama.cpp / WICK_MATMUL=fast)
    #       | "torch" (every tensor stored in bf16 between ops, as transformers with torch_dtype=bfloat16)
    r = bf16 if mode == "torch" else (lambda a: a)
    mm = (lambda h, w: bf16(h) @ w.T) if mode in ("act", "torch") else (lambda h, w: h @ w.T)
    ids = np.asarray(ids); T, H, KV, hd = len(ids), hp["n_head"], hp["n_head_kv"], hp["head_dim"]
    pos = np.arange(T, dtype=np.float64)
    x = r(W["embd"][ids].astype(np.float64))
    mask = np.triu(np.full((T, T), -np.inf), 1)
    for L in W["layers"]:
        h = r(R.rmsnorm(x, L["an"], hp["eps"]))
        q = r(R.rope(r(mm(h, L["q"])).reshape(T, H, hd), pos, hp))
        k = r(R.rope(r(mm(h, L["k"])).reshape(T, KV, hd), pos, hp))
        v = r(mm(h, L["v"])).reshape(T, KV, hd)
        k, v = np.repeat(k, H // KV, 1), np.repeat(v, H // KV, 1)
        s = np.einsum("thd,shd->hts", q, k) / np.sqrt(hd) + mask
        p = np.exp(s - s.max(-1, keepdims=True)); p /= p.sum(-1, keepdims=True)
        a = r(np.einsum("hts,shd->thd", r(p), v).reshape(T, H * hd))
        x = r(x + r(mm(a, L["o"])))
        h = r(R.rmsnorm(x, L["fn"], hp["eps"]))
        g = r(mm(h, L["g"]))
        x = r(x + r(mm(r(r(g / (1 + np.exp(-g))) * r(mm(h, L["u"]))), L["d"])))
    return r(mm(r(R.rmsnorm(x, W["norm"], hp["eps"])), W["out"]))

def tiny(fix):
    ref = json.load(open(f"{fix}/reference.json"))
    W, hp = R.load_safetensors(fix)
    # weights rounded to bf16, as the bf16w fixture
    W = {k: ([{kk: bf16(vv) for kk, vv in L.items()} for L in v] if k == "layers" else bf16(v)) for k, v in W.items()}
    for p in ref["prompts"]:
        exp = np.fromfile(f"{fix}/{p['logits'].replace('.f32','_bf16w.f32')}", dtype=np.float32).reshape(p["logits_shape"])
        print(fix.split('/')[-1], p["logits"], {m: f"{R.rel_err(forward(W, hp, p['ids'], m), exp):.1e}" for m in ("exact", "act", "torch")})

def real(gguf, ids):
    W, hp = R.load_gguf(gguf)
    ex = forward(W, hp, ids, "exact")
    for m in ("act", "torch"):
        y = forward(W, hp, ids, m)
        def lsm(z): z = z - z.max(-1, keepdims=True); return z - np.log(np.exp(z).sum(-1, keepdims=True))
        P, Q = lsm(ex), lsm(y)
        kl = (np.exp(P) * (P - Q)).sum(-1)
        top = (ex.argmax(-1) == y.argmax(-1)).mean()
        print(m, f"rel err {R.rel_err(y, ex):.1e} max|dlogit| {np.abs(y-ex).max():.3f} meanKL {kl.mean():.2e} maxKL {kl.max():.2e} top1 {top*100:.1f}%")

if sys.argv[1] == "tiny": tiny(sys.argv[2])
else: real(sys.argv[2], [int(t) for t in sys.argv[3].split(",")])
