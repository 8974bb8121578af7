#!/usr/bin/env python3
"""LoRA adapter fixtures for the tiny models, and what applying them must give.

An adapter adds scale * B @ A to each weight it targets (PEFT's LoRA:
scale = lora_alpha / r, or / sqrt(r) with use_rslora; llama.cpp's GGUF
adapters: scale * alpha / rank). The references here merge that product into
the weights with numpy, as PEFT's merge_and_unload does, and never run wick:
- llama: the float64 numpy forward of ref_forward.py (checked against HF
  transformers' logits on this model) on the merged weights;
- the other architectures: the merged weights as a HF folder of their own,
  which wick loads as a plain model (its HF-reference tests cover them).

The same A and B are written as a PEFT folder and as a GGUF adapter laid out
as llama.cpp's convert_lora_to_gguf.py writes one (general.type "adapter",
blk.N.<name>.weight.lora_a/lora_b, q/k rows of llama-family models
interleaved as in their GGUF files, lora_a in f16).

usage: make_lora_fixtures.py SHARED_DIR OUT_DIR
"""
import json
import os
import shutil
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ref_forward import forward, load_safetensors  # noqa: E402

ATTN = ["q_proj", "k_proj", "v_proj", "o_proj"]
MLP = ["gate_proj", "up_proj", "down_proj"]
GGUF_NAME = dict(q_proj="attn_q", k_proj="attn_k", v_proj="attn_v", o_proj="attn_output",
                 gate_proj="ffn_gate", up_proj="ffn_up", down_proj="ffn_down")


def module_weight(layer, mod):
    part = "self_attn" if mod in ATTN else "mlp"
    return f"model.layers.{layer}.{part}.{mod}"


def make_adapter(rng, base, n_layer, targets, layers, r):
    """{module path: (A [r, n_in], B [n_out, r])}, A f16-exact so both formats hold it."""
    out = {}
    for il in layers:
        for mod in targets:
            n_out, n_in = base[module_weight(il, mod) + ".weight"].shape
            a = rng.normal(0, 0.05, (r, n_in)).astype(np.float16).astype(np.float32)
            b = rng.normal(0, 0.05, (n_out, r)).astype(np.float32)
            out[module_weight(il, mod)] = (a, b)
    return out


def write_peft(path, pairs, cfg):
    from safetensors.numpy import save_file
    os.makedirs(path, exist_ok=True)
    t = {}
    for mod, (a, b) in pairs.items():
        t[f"base_model.model.{mod}.lora_A.weight"] = a
        t[f"base_model.model.{mod}.lora_B.weight"] = b
    save_file(t, f"{path}/adapter_model.safetensors")
    json.dump(dict({"peft_type": "LORA", "bias": "none", "fan_in_fan_out": False,
                    "use_dora": False, "task_type": "CAUSAL_LM"}, **cfg),
              open(f"{path}/adapter_config.json", "w"), indent=1)


def interleave_rows(w, n_head):
    """llama.cpp's converter's q/k row order: each head's two RoPE halves interleaved."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(path, pairs, alpha, cfg):
    import gguf
    w = gguf.GGUFWriter(path, "llama")
    w.add_string("general.type", "adapter")
    w.add_string("adapter.type", "lora")
    w.add_float32("adapter.lora.alpha", alpha)
    for mod, (a, b) in pairs.items():
        layer, name = int(mod.split(".")[2]), GGUF_NAME[mod.split(".")[-1]]
        if name in ("attn_q", "attn_k"):
            b = interleave_rows(b, cfg["num_attention_heads"] if name == "attn_q"
                                else cfg["num_key_value_heads"])
        w.add_tensor(f"blk.{layer}.{name}.weight.lora_a", a.astype(np.float16))
        w.add_tensor(f"blk.{layer}.{name}.weight.lora_b", np.ascontiguousarray(b))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def merged(base, adapters):
    """The base's tensors with scale * B @ A added, float64 sums, float32 out."""
    out = dict(base)
    for pairs, scale in adapters:
        for mod, (a, b) in pairs.items():
            k = mod + ".weight"
            out[k] = (out[k].astype(np.float64) + scale * (b.astype(np.float64) @ a)).astype(np.float32)
    return out


def write_folder(path, cfg_src, tensors):
    from safetensors.numpy import save_file
    os.makedirs(path, exist_ok=True)
    shutil.copyfile(cfg_src, f"{path}/config.json")
    save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, f"{path}/model.safetensors")


def main():
    from safetensors.numpy import load_file
    shared, out = sys.argv[1], sys.argv[2]
    tiny = f"{shared}/fixtures/tiny-models"
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(11)
    ids = [int(x) for x in rng.integers(3, 512, 40)]
    json.dump(ids, open(f"{out}/ids.json", "w"))

    # llama: every target, PEFT and GGUF; a second rsLoRA adapter on a few
    cfg = json.load(open(f"{tiny}/llama/config.json"))
    base = load_file(f"{tiny}/llama/model.safetensors")
    n_layer = cfg["num_hidden_layers"]
    one = make_adapter(rng, base, n_layer, ATTN + MLP, range(n_layer), 4)
    two = make_adapter(rng, base, n_layer, ["q_proj", "v_proj", "down_proj"], [1], 3)
    d = f"{out}/llama"
    write_peft(f"{d}/peft", one, {"r": 4, "lora_alpha": 8, "target_modules": ATTN + MLP})
    write_peft(f"{d}/peft-rslora", two, {"r": 3, "lora_alpha": 6, "use_rslora": True,
                                         "target_modules": ["q_proj", "v_proj", "down_proj"]})
    write_gguf(f"{d}/adapter.gguf", one, 8.0, cfg)
    # stored in f16 as a half-precision training run saves it (B rounded to f16 too)
    half = {m: (a_, b_.astype(np.float16).astype(np.float32)) for m, (a_, b_) in one.items()}
    write_peft(f"{d}/peft-f16", {m: (a_.astype(np.float16), b_.astype(np.float16))
                                 for m, (a_, b_) in half.items()},
               {"r": 4, "lora_alpha": 8, "target_modules": ATTN + MLP})
    # the second adapter at --lora-scaled 0.5: 0.5 * 6 / sqrt(3)
    for name, adapters in {"ref_one": [(one, 8 / 4)], "ref_f16": [(half, 8 / 4)],
                           "ref_both": [(one, 8 / 4), (two, 0.5 * 6 / np.sqrt(3))]}.items():
        write_folder(f"{d}/{name}", f"{tiny}/llama/config.json", merged(base, adapters))
        W, hp = load_safetensors(f"{d}/{name}")
        forward(W, hp, ids).astype(np.float32).tofile(f"{d}/{name}.f32")
        shutil.rmtree(f"{d}/{name}")

    # the others: attention and dense MLP targets; MoE models attention only
    for arch in ("mistral", "qwen2", "qwen3", "mixtral", "qwen3_moe"):
        cfg_path = f"{tiny}/{arch}/config.json"
        cfg = json.load(open(cfg_path))
        base = load_file(f"{tiny}/{arch}/model.safetensors")
        moe = arch in ("mixtral", "qwen3_moe")
        targets = ATTN if moe else ATTN + MLP
        pairs = make_adapter(rng, base, cfg["num_hidden_layers"], targets,
                             range(cfg["num_hidden_layers"]), 2)
        write_peft(f"{out}/{arch}/peft", pairs, {"r": 2, "lora_alpha": 4, "target_modules": targets})
        write_folder(f"{out}/{arch}/merged", cfg_path, merged(base, [(pairs, 2.0)]))

    # refused: DoRA; an expert's projection
    bad = f"{out}/bad"
    write_peft(f"{bad}/dora", one, {"r": 4, "lora_alpha": 8, "use_dora": True,
                                    "target_modules": ATTN + MLP})
    moe_cfg = json.load(open(f"{tiny}/qwen3_moe/config.json"))
    moe_base = load_file(f"{tiny}/qwen3_moe/model.safetensors")
    n_in = moe_cfg["hidden_size"]
    n_ff = moe_base["model.layers.0.mlp.experts.0.gate_proj.weight"].shape[0]
    write_peft(f"{bad}/experts", {"model.layers.0.mlp.experts.0.gate_proj":
                                  (np.zeros((2, n_in), np.float32), np.zeros((n_ff, 2), np.float32))},
               {"r": 2, "lora_alpha": 2, "target_modules": ["gate_proj"]})
    print(f"lora fixtures: {len(ids)} ids; llama, mistral, qwen2, qwen3, mixtral, qwen3_moe")


if __name__ == "__main__":
    main()
