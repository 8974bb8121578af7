#!/usr/bin/env python3
"""Writes test fixtures with the reference `gguf` package (not wick's code).

OUT/quants.gguf: one tensor per supported type (random blocks with sane f16
scales), metadata of every value type including nested arrays.
OUT/<type>.f32: gguf.quants.dequantize of that tensor, float32.
OUT/expect.json: the metadata written and the tensor list.
"""
import json
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as Q

# (type, byte offsets of f16 scale fields inside a block)
TYPES = {
    Q.Q4_0: [0], Q.Q4_1: [0, 2], Q.Q5_0: [0], Q.Q5_1: [0, 2], Q.Q8_0: [0],
    Q.Q4_K: [0, 2], Q.Q5_K: [0, 2], Q.Q6_K: [208],
    Q.Q2_K: [80, 82], Q.Q3_K: [108], Q.IQ4_NL: [0], Q.IQ4_XS: [0],
}


def main(out):
    import os
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(1234)
    w = gguf.GGUFWriter(f"{out}/quants.gguf", arch="llama")
    meta = {
        "test.u8": (255, gguf.GGUFValueType.UINT8), "test.i8": (-128, gguf.GGUFValueType.INT8),
        "test.u16": (65535, gguf.GGUFValueType.UINT16), "test.i16": (-32768, gguf.GGUFValueType.INT16),
        "test.u32": (4000000000, gguf.GGUFValueType.UINT32), "test.i32": (-2000000000, gguf.GGUFValueType.INT32),
        "test.u64": (2**63 + 5, gguf.GGUFValueType.UINT64), "test.i64": (-(2**62), gguf.GGUFValueType.INT64),
        "test.f32": (0.25, gguf.GGUFValueType.FLOAT32), "test.f64": (-1.5e300, gguf.GGUFValueType.FLOAT64),
        "test.bool": (True, gguf.GGUFValueType.BOOL), "test.str": ("héllo ✓", gguf.GGUFValueType.STRING),
    }
    for k, (v, t) in meta.items():
        w.add_key_value(k, v, t)
    w.add_array("test.arr_i32", [1, -2, 3])
    w.add_array("test.arr_str", ["a", "", "ü"])
    w.add_array("test.nested", [[1, 2], [3, 4, 5]])
    rows = 3
    expect = {"tensors": []}
    for t, scale_offs in TYPES.items():
        bs, bb = gguf.GGML_QUANT_SIZES[t]
        n_per_row = 2 * 256
        nb = rows * n_per_row // bs
        raw = rng.integers(0, 256, size=(nb, bb), dtype=np.uint8)
        for off in scale_offs:  # f16 scales in [-2, 2]: finite, both signs
            d = rng.uniform(-2, 2, size=nb).astype(np.float16).view(np.uint8).reshape(nb, 2)
            raw[:, off:off + 2] = d
        raw = raw.reshape(rows, -1)
        name = f"t_{t.name.lower()}"
        w.add_tensor(name, raw, raw_dtype=t)
        deq = gguf.quants.dequantize(raw, t).astype(np.float32)
        deq.tofile(f"{out}/{t.name.lower()}.f32")
        expect["tensors"].append({"name": name, "type": t.name.lower(), "shape": [rows, n_per_row]})
    for t, dt in [(Q.F32, np.float32), (Q.F16, np.float16)]:
        a = rng.standard_normal((rows, 40)).astype(dt)
        w.add_tensor(f"t_{t.name.lower()}", a)
        a.astype(np.float32).tofile(f"{out}/{t.name.lower()}.f32")
        expect["tensors"].append({"name": f"t_{t.name.lower()}", "type": t.name.lower(), "shape": [rows, 40]})
    bf = (rng.standard_normal((rows, 40)).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    w.add_tensor("t_bf16", bf.view(np.uint8).reshape(rows, -1), raw_dtype=Q.BF16)
    gguf.quants.dequantize(bf.view(np.uint8).reshape(rows, -1), Q.BF16).astype(np.float32).tofile(f"{out}/bf16.f32")
    expect["tensors"].append({"name": "t_bf16", "type": "bf16", "shape": [rows, 40]})
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    json.dump(expect, open(f"{out}/expect.json", "w"), indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
