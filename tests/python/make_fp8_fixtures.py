#!/usr/bin/env python3
"""FP8 checkpoints of the tiny models, and the bf16 weights they must load as.

Each variant quantizes the linear weights of one tiny model (attention, MLP
and experts; not the embeddings, norms, router or head, as real FP8
checkpoints leave them) to float8 with ml_dtypes, as the checkpoints on the
Hub are laid out:
- "fp8" with weight_block_size (Qwen3-*-FP8, DeepSeek): a scale per block
  of rows x cols in "<weight>_scale_inv", w = q * scale_inv;
- compressed-tensors' float-quantized with one scale a row in
  "<weight>_scale" ([n_out, 1]) and a static "input_scale" wick ignores;
- "fp8" with one scale a tensor (vLLM's per-tensor checkpoints), here e5m2.
Block sizes that do not divide the tiny shapes test the partial blocks at
the edges.

For each variant OUT/<name>/fp8 is the checkpoint and OUT/<name>/want the
same model with every quantized weight replaced by ml_dtypes' float value of
its code times its scale (a float32 product) rounded to bf16: wick must load
the first as exactly the second. Hostile variants (a NaN code, a missing or
misshapen scale, an unsupported quantization method) sit beside them.

usage: make_fp8_fixtures.py SHARED_DIR OUT_DIR
"""
import json
import os
import shutil
import struct
import sys

import ml_dtypes
import numpy as np

LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
          ".w1.", ".w2.", ".w3.")
ST_DTYPE = {np.dtype(np.float32): "F32", np.dtype(ml_dtypes.bfloat16): "BF16",
            np.dtype(np.float16): "F16", np.dtype(ml_dtypes.float8_e4m3fn): "F8_E4M3",
            np.dtype(ml_dtypes.float8_e5m2): "F8_E5M2"}
FMAX = {"e4m3": 448.0, "e5m2": 57344.0}
FTYPE = {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}


def read_st(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        assert info["dtype"] == "F32", (name, info["dtype"])
        b, e = info["data_offsets"]
        out[name] = np.frombuffer(data[b:e], dtype=np.float32).reshape(info["shape"])
    return out


def write_st(path, tensors):
    header, blobs, off = {}, [], 0
    for name, a in tensors.items():
        raw = np.ascontiguousarray(a).tobytes()
        header[name] = {"dtype": ST_DTYPE[a.dtype], "shape": list(a.shape),
                        "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def is_linear(name):
    return name.endswith(".weight") and any(k in name for k in LINEAR)


def quantize(w, fmt, grid):
    """w [O, I] float32 -> (codes, scale float32 of the grid's shape, dequantized float32).

    grid: ("block", br, bc), ("row",) or ("tensor",)."""
    O, I = w.shape
    if grid[0] == "block":
        br, bc = grid[1], grid[2]
        nr, nc = -(-O // br), -(-I // bc)
        scale = np.zeros((nr, nc), np.float32)
        for i in range(nr):
            for j in range(nc):
                blk = w[i * br:(i + 1) * br, j * bc:(j + 1) * bc]
                scale[i, j] = np.abs(blk).max() / FMAX[fmt]
        full = np.repeat(np.repeat(scale, br, 0), bc, 1)[:O, :I]
    elif grid[0] == "row":
        scale = (np.abs(w).max(axis=1, keepdims=True) / FMAX[fmt]).astype(np.float32)
        full = np.broadcast_to(scale, w.shape)
    else:
        scale = np.array([np.abs(w).max() / FMAX[fmt]], np.float32)
        full = np.broadcast_to(scale, w.shape)
    codes = (w / np.where(full == 0, 1, full)).astype(FTYPE[fmt])
    return codes, scale, full


VARIANTS = [
    # name, tiny model, format, grid, scale name suffix, scale dtype, quantization_config
    ("llama-block", "llama", "e4m3", ("block", 48, 40), "_scale_inv", np.float32,
     {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
      "weight_block_size": [48, 40], "modules_to_not_convert": ["lm_head"]}),
    ("qwen3_moe-block", "qwen3_moe", "e4m3", ("block", 16, 32), "_scale_inv", ml_dtypes.bfloat16,
     {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
      "weight_block_size": [16, 32]}),
    ("qwen3-channel", "qwen3", "e4m3", ("row",), "_scale", np.float32,
     {"quant_method": "compressed-tensors", "format": "float-quantized",
      "config_groups": {"group_0": {"targets": ["Linear"], "weights": {
          "num_bits": 8, "type": "float", "strategy": "channel", "symmetric": True}}},
      "ignore": ["lm_head"]}),
    ("mistral-tensor-e5m2", "mistral", "e5m2", ("tensor",), "_scale", np.float32,
     {"quant_method": "fp8", "activation_scheme": "static"}),
]


def make(shared, out, name, model, fmt, grid, suffix, sdtype, qcfg):
    src = f"{shared}/fixtures/tiny-models/{model}"
    cfg = json.load(open(f"{src}/config.json"))
    t = read_st(f"{src}/model.safetensors")
    fp8, want = {}, {}
    for k, w in t.items():
        if not is_linear(k):
            fp8[k] = want[k] = w
            continue
        codes, scale, full = quantize(w, fmt, grid)
        fp8[k] = codes
        fp8[k + suffix] = scale.astype(sdtype)
        if suffix == "_scale" and grid[0] == "row":
            fp8[k.replace(".weight", ".input_scale")] = np.array([0.5], np.float32)
        # the stored scale's value, in float32, times the code's
        s = np.broadcast_to(fp8[k + suffix].astype(np.float32), scale.shape)
        if grid[0] == "block":
            s = np.repeat(np.repeat(s, grid[1], 0), grid[2], 1)[:w.shape[0], :w.shape[1]]
        want[k] = (codes.astype(np.float32) * s).astype(np.float32).astype(ml_dtypes.bfloat16)
    for sub, tensors, c in (("fp8", fp8, dict(cfg, quantization_config=qcfg)), ("want", want, cfg)):
        d = f"{out}/{name}/{sub}"
        os.makedirs(d, exist_ok=True)
        json.dump(c, open(f"{d}/config.json", "w"), indent=1)
        write_st(f"{d}/model.safetensors", tensors)
    return cfg, fp8


def hostile(out, base_cfg, base):
    """Copies of llama-block's checkpoint with one thing wrong each."""
    first = "model.layers.0.self_attn.q_proj.weight"

    def put(name, tensors, cfg):
        d = f"{out}/bad/{name}"
        os.makedirs(d, exist_ok=True)
        json.dump(cfg, open(f"{d}/config.json", "w"), indent=1)
        write_st(f"{d}/model.safetensors", tensors)

    nan = dict(base)
    codes = base[first].view(np.uint8).copy()
    codes[3, 5] = 0x7F  # e4m3's NaN
    nan[first] = codes.view(ml_dtypes.float8_e4m3fn)
    put("nan-code", nan, base_cfg)
    put("no-scale", {k: v for k, v in base.items() if k != first + "_scale_inv"}, base_cfg)
    put("scale-shape", dict(base, **{first + "_scale_inv": np.ones((3, 3), np.float32)}),
        base_cfg)
    inf = dict(base, **{first + "_scale_inv": base[first + "_scale_inv"].copy()})
    inf[first + "_scale_inv"][0, 1] = np.inf
    put("scale-inf", inf, base_cfg)
    put("gptq", base, dict(base_cfg, quantization_config={"quant_method": "gptq", "bits": 4}))
    put("method-number", base, dict(base_cfg, quantization_config={"quant_method": 8}))
    put("int4-packed", base, dict(base_cfg, quantization_config={
        "quant_method": "compressed-tensors", "format": "pack-quantized"}))
    put("norm-fp8", dict(base, **{"model.norm.weight":
                                  base["model.norm.weight"].astype(ml_dtypes.float8_e4m3fn)}),
        base_cfg)


def main():
    shared, out = sys.argv[1], sys.argv[2]
    shutil.rmtree(out, ignore_errors=True)
    for v in VARIANTS:
        cfg, fp8 = make(shared, out, *v)
        if v[0] == "llama-block":
            hostile(out, dict(cfg, quantization_config=v[-1]), fp8)
    # every code of both formats as ml_dtypes reads it (NaN, inf included)
    for fmt, ftype in FTYPE.items():
        np.arange(256, dtype=np.uint8).view(ftype).astype(np.float32).tofile(f"{out}/{fmt}.f32")
    json.dump([v[0] for v in VARIANTS], open(f"{out}/variants.json", "w"))
    print(f"fp8 fixtures: {out}")


if __name__ == "__main__":
    main()
