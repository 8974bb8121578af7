#!/usr/bin/env python3
"""Random rank-16 PEFT adapters on every projection of a model's shapes, for `wick bench
--lora` (docs/perf.md, "LoRA terms in f16"; scripts/gpu_check's lora stage): OUT-f32 holds f32
values, OUT-f16 the same draws in f16.
Usage: .venv/bin/python scripts/make_bench_lora.py [OUT [SHAPE]]
(default /tmp/smol-lora, SHAPE smollm2: SmolLM2-135M; qwen2.5-0.5b: Qwen2.5-0.5B)"""
import json
import os
import sys

import numpy as np
from safetensors.numpy import save_file

# hidden, intermediate, layers, kv dim (kv heads x head dim)
SHAPES_OF = {"smollm2": (576, 1536, 30, 192), "qwen2.5-0.5b": (896, 4864, 24, 128)}
R = 16
H, FF, N_LAYER, KV = SHAPES_OF[sys.argv[2] if len(sys.argv) > 2 else "smollm2"]
SHAPES = {"self_attn.q_proj": (H, H), "self_attn.k_proj": (KV, H), "self_attn.v_proj": (KV, H),
          "self_attn.o_proj": (H, H), "mlp.gate_proj": (FF, H), "mlp.up_proj": (FF, H),
          "mlp.down_proj": (H, FF)}

out = sys.argv[1] if len(sys.argv) > 1 else "/tmp/smol-lora"
for suffix, dt in (("-f32", np.float32), ("-f16", np.float16)):
    d = out + suffix
    os.makedirs(d, exist_ok=True)
    rng = np.random.default_rng(1)
    t = {}
    for il in range(N_LAYER):
        for m, (n_out, n_in) in SHAPES.items():
            pre = f"base_model.model.model.layers.{il}.{m}"
            t[pre + ".lora_A.weight"] = rng.normal(0, 0.02, (R, n_in)).astype(dt)
            t[pre + ".lora_B.weight"] = rng.normal(0, 0.02, (n_out, R)).astype(dt)
    save_file(t, f"{d}/adapter_model.safetensors")
    json.dump({"peft_type": "LORA", "r": R, "lora_alpha": 32, "bias": "none"},
              open(f"{d}/adapter_config.json", "w"))
    print(d)
