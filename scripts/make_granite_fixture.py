#!/usr/bin/env python3
"""Writes a tiny random-weight Granite fixture (tests/fixtures/tiny-models/granite, or with
`granitemoe` first, tests/fixtures/tiny-models/granitemoe) and its HF transformers reference outputs, in the layout of ../shared/fixtures/tiny-models/<arch>
(see ../shared/README.md): model.safetensors (f32), bf16/model.safetensors, config.json,
reference.json and the raw little-endian float32 pN_logits / pN_hidden / pN_logits_bf16w files.

It needs torch and a transformers with GraniteForCausalLM (4.45 or later), which wick's test
tooling does not install; the fixture is committed, so this runs only to remake it. What made
the committed one (Debian 12's python3-torch 1.13.1, the system Python 3.11):

  apt-get install --no-install-recommends python3-torch python3-venv
  python3 -m venv --system-site-packages /tmp/granite-ref
  /tmp/granite-ref/bin/pip install transformers==4.46.3 safetensors
  /tmp/granite-ref/bin/python scripts/make_granite_fixture.py tests/fixtures/tiny-models/granite
  /tmp/granite-ref/bin/python scripts/make_granite_fixture.py granitemoe \
      tests/fixtures/tiny-models/granitemoe

Granite (IBM's granite-3.x dense models, spnl's default generator) is Llama with four
multipliers; the values below are granite-3.x-2b's except attention_multiplier, which is
1/head_dim as there (not 1/sqrt(head_dim), so that a missing multiplier shows). GraniteMoe
(granite-3.x-1b-a400m, -3b-a800m) has the same layers with a mixture of experts in place of the
MLP: each expert's gate and up projections stacked in one `input_linear` [experts, 2 x ff,
hidden], the router's top k logits softmaxed; the fixture has 4 experts, 2 per token.
"""
import json
import os
import sys

import numpy as np
import torch
import transformers
from safetensors.torch import save_file
from transformers import (GraniteConfig, GraniteForCausalLM, GraniteMoeConfig,
                          GraniteMoeForCausalLM)

N_VOCAB, N_EMBD, N_HEAD, N_HEAD_KV, N_FF, N_LAYER = 512, 64, 4, 2, 128, 2
PROMPT_LENGTHS = (24, 8, 41)
N_GREEDY = 16
N_EXPERT, N_EXPERT_USED = 4, 2
ARCH = "granite"  # or "granitemoe" (main's first argument)
# the projections larger than the embeddings (std 0.08, as the other tiny fixtures'), so that
# the layers outweigh x12 embeddings beside x0.22 residuals: with all at 0.08 the tied head
# predicts the last token again, and greedy decoding repeats it
WEIGHT_STD = 0.35

HUB_KEYS = ("attention_bias", "attention_dropout", "attention_multiplier", "bos_token_id",
            "embedding_multiplier", "eos_token_id", "hidden_act", "hidden_size",
            "initializer_range", "intermediate_size", "logits_scaling", "max_position_embeddings",
            "mlp_bias", "model_type", "num_attention_heads", "num_hidden_layers",
            "num_key_value_heads", "pad_token_id", "residual_multiplier", "rms_norm_eps",
            "rope_scaling", "rope_theta", "tie_word_embeddings", "transformers_version",
            "use_cache", "vocab_size")
MOE_KEYS = ("num_local_experts", "num_experts_per_tok", "output_router_logits",
            "router_aux_loss_coef")


def config():
    moe = ARCH == "granitemoe"
    extra = dict(num_local_experts=N_EXPERT, num_experts_per_tok=N_EXPERT_USED) if moe else {}
    return (GraniteMoeConfig if moe else GraniteConfig)(
        **extra,
        vocab_size=N_VOCAB,
        hidden_size=N_EMBD,
        intermediate_size=N_FF,
        num_hidden_layers=N_LAYER,
        num_attention_heads=N_HEAD,
        num_key_value_heads=N_HEAD_KV,
        max_position_embeddings=512,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        attention_bias=False,
        embedding_multiplier=12.0,
        residual_multiplier=0.22,
        attention_multiplier=1.0 / (N_EMBD // N_HEAD),
        logits_scaling=8.0,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=0,
        attn_implementation="eager",
    )


def random_model(seed: int):
    torch.manual_seed(seed)
    cls = GraniteMoeForCausalLM if ARCH == "granitemoe" else GraniteForCausalLM
    m = cls(config()).eval()
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            elif name == "model.embed_tokens.weight":
                p.copy_(0.08 * torch.randn_like(p))
            else:
                p.copy_(WEIGHT_STD * torch.randn_like(p))
    return m


def logits_and_hidden(m, ids):
    with torch.no_grad():
        out = m(torch.tensor([ids]), output_hidden_states=True)
    # HF's hidden_states: the scaled embeddings, each layer's input, and the final norm's output
    hs = out.hidden_states
    hidden = torch.stack([h[0] for h in hs])
    return out.logits[0].float().numpy(), hidden.float().numpy()


def greedy(m, ids, n):
    ids = list(ids)
    new = []
    with torch.no_grad():
        for _ in range(n):
            nxt = int(m(torch.tensor([ids])).logits[0, -1].argmax())
            ids.append(nxt)
            new.append(nxt)
    return new


def main(out_dir: str) -> None:
    os.makedirs(os.path.join(out_dir, "bf16"), exist_ok=True)
    m = random_model(20261125)
    tensors = {k: v.contiguous() for k, v in m.state_dict().items() if k != "lm_head.weight"}
    meta = {"format": "pt"}
    save_file(tensors, os.path.join(out_dir, "model.safetensors"), metadata=meta)
    save_file({k: v.to(torch.bfloat16) for k, v in tensors.items()},
              os.path.join(out_dir, "bf16", "model.safetensors"), metadata=meta)
    # the keys a hub Granite config.json has, not every generation default
    full = m.config.to_dict()
    keys = HUB_KEYS + MOE_KEYS if ARCH == "granitemoe" else HUB_KEYS
    cfg = {k: full[k] for k in keys if k in full}
    cfg["architectures"] = [type(m).__name__]
    for d in (out_dir, os.path.join(out_dir, "bf16")):
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(cfg, f, indent=2, sort_keys=True)
            f.write("\n")

    # the same model with every weight rounded to bf16, computed in f32
    m16 = random_model(20261125)
    with torch.no_grad():
        for p in m16.parameters():
            p.copy_(p.to(torch.bfloat16).float())

    rng = np.random.default_rng(7)
    prompts = []
    for i, n in enumerate(PROMPT_LENGTHS):
        ids = [0] + [int(t) for t in rng.integers(1, N_VOCAB, n - 1)]
        logits, hidden = logits_and_hidden(m, ids)
        logits16, _ = logits_and_hidden(m16, ids)
        logits.astype("<f4").tofile(os.path.join(out_dir, f"p{i}_logits.f32"))
        hidden.astype("<f4").tofile(os.path.join(out_dir, f"p{i}_hidden.f32"))
        logits16.astype("<f4").tofile(os.path.join(out_dir, f"p{i}_logits_bf16w.f32"))
        prompts.append({
            "ids": ids,
            "logits": f"p{i}_logits.f32",
            "logits_shape": list(logits.shape),
            "hidden": f"p{i}_hidden.f32",
            "hidden_shape": list(hidden.shape),
            "logits_bf16_weights": f"p{i}_logits_bf16w.f32",
            "greedy_continuation": greedy(m, ids, N_GREEDY),
        })
    ref = {
        "arch": ARCH,
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "dtype_compute": "float32",
        "note": "logits files are raw little-endian float32, row-major, shape given; "
                "hidden: embeddings x embedding_multiplier, each later layer's input, the final norm's output",
        "prompts": prompts,
    }
    with open(os.path.join(out_dir, "reference.json"), "w") as f:
        json.dump(ref, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    args = sys.argv[1:]
    if args and args[0] in ("granite", "granitemoe"):
        ARCH = args.pop(0)
    if len(args) != 1:
        sys.exit("usage: make_granite_fixture.py [granite|granitemoe] OUT_DIR")
    main(args[0])
