#!/usr/bin/env python3
"""RoPE scaling fixtures: the tiny llama with YaRN configs, and their logits.

The numpy forward of ref_forward.py (float64, checked against HF transformers'
logits on the tiny llama) applies YaRN as transformers does: its inverse
frequencies, and cos and sin multiplied by the attention factor. wick divides
the frequencies and scales the scores instead, so the two agree only if both
follow the same rule.

usage: make_rope_fixtures.py SHARED_DIR OUT_DIR
writes OUT_DIR/{llama-yarn,llama-yarn-explicit,llama-default}/ (config.json,
model.safetensors, ref_logits.f32), OUT_DIR/ids.json and OUT_DIR/yarn_cases.json
(configs and transformers' frequencies and attention factor for them).
"""
import json
import os
import shutil
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ref_forward import forward, load_safetensors, yarn_params  # noqa: E402

VARIANTS = {
    # transformers 5's spelling
    "llama-yarn": {"rope_parameters": {"rope_type": "yarn", "factor": 4.0,
                                       "original_max_position_embeddings": 64,
                                       "rope_theta": 10000.0}},
    # the hub's older spelling, every optional key set away from its default
    "llama-yarn-explicit": {"rope_theta": 10000.0,
                            "rope_scaling": {"type": "yarn", "factor": 3.0,
                                             "original_max_position_embeddings": 48,
                                             "attention_factor": 1.3, "beta_fast": 16,
                                             "beta_slow": 2, "truncate": False}},
    "llama-default": {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}},
}

# Shapes of released models' YaRN settings (Qwen2.5/Qwen3, DeepSeek-V2/V3's
# mscale pair, gpt-oss's truncate=false) and the fall-backs transformers takes.
CASES = [
    dict(head_dim=128, max_pos=32768, rope={"rope_type": "yarn", "factor": 4.0,
                                            "original_max_position_embeddings": 32768,
                                            "rope_theta": 1000000.0}),
    dict(head_dim=64, max_pos=163840, rope={"rope_type": "yarn", "factor": 40.0,
                                            "original_max_position_embeddings": 4096,
                                            "rope_theta": 10000.0, "mscale": 0.707,
                                            "mscale_all_dim": 1.0, "beta_fast": 32, "beta_slow": 1}),
    dict(head_dim=64, max_pos=131072, rope={"rope_type": "yarn", "factor": 32.0,
                                            "original_max_position_embeddings": 4096,
                                            "rope_theta": 150000.0, "truncate": False}),
    # no factor: the ratio of the contexts; betas 0: the defaults
    dict(head_dim=128, max_pos=131072, rope={"rope_type": "yarn",
                                             "original_max_position_embeddings": 32768,
                                             "rope_theta": 1000000.0, "beta_fast": 0,
                                             "beta_slow": 0}),
    # below 1: no attention factor
    dict(head_dim=96, max_pos=4096, rope={"rope_type": "yarn", "factor": 0.5,
                                          "original_max_position_embeddings": 4096,
                                          "rope_theta": 500000.0}),
]


def main():
    shared, out = sys.argv[1], sys.argv[2]
    tiny = f"{shared}/fixtures/tiny-models/llama"
    if not os.path.isdir(tiny):
        sys.exit(f"{tiny} not found")
    os.makedirs(out, exist_ok=True)
    base = json.load(open(f"{tiny}/config.json"))
    ids = [int(x) for x in np.random.default_rng(7).integers(3, base["vocab_size"], 200)]
    json.dump(ids, open(f"{out}/ids.json", "w"))
    for name, rope in VARIANTS.items():
        d = f"{out}/{name}"
        os.makedirs(d, exist_ok=True)
        cfg = {k: v for k, v in base.items() if k not in ("rope_parameters", "rope_scaling")}
        cfg.update(rope)
        json.dump(cfg, open(f"{d}/config.json", "w"), indent=1)
        shutil.copyfile(f"{tiny}/model.safetensors", f"{d}/model.safetensors")
        W, hp = load_safetensors(d)
        forward(W, hp, ids).astype(np.float32).tofile(f"{d}/ref_logits.f32")
        print(f"{name}: {len(ids)} positions, attention factor {hp.get('attn_factor', 1.0)}")
    cases = []
    for c in CASES:
        inv, af = yarn_params(c["head_dim"], c["rope"], c["max_pos"])
        cases.append(dict(c, inv_freq=[float(x) for x in inv], attention_factor=float(af)))
    json.dump(cases, open(f"{out}/yarn_cases.json", "w"), indent=1)
    print(f"{len(cases)} yarn cases")


if __name__ == "__main__":
    main()
