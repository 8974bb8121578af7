#!/usr/bin/env python3
"""Write a random-weight mixture-of-experts GGUF with the shape of a real one, for speed work.

Usage: make_shaped_moe.py SHAPE TYPE N_LAYERS OUT.gguf
  SHAPE: qwen3-30b-a3b (128 experts, 8 per token, 2048 wide, 768 per expert: Qwen3-30B-A3B's
         layer) or mixtral-8x7b (8 experts, 2 per token, 4096 wide, 14336 per expert).
  TYPE:  q4_k (the experts and attention Q4_K, the output Q6_K: what a Q4_K_M file holds for most
         of its bytes) or q8_0 (Q8_0 throughout).
  N_LAYERS: the real model's layers are all alike, so fewer of them (the first N) measure the
         per-layer cost in less memory; the embedding and the output head are whole.
The weights are random blocks with sane f16 scales (speed does not depend on their values), the
router is random f32, so tokens spread over the experts as in a trained model. The tokenizer
comes from ../shared/tokenizers/ (Qwen's for Qwen3, Llama 3's for Mixtral). Both wick and
llama.cpp run the file (scripts/bench_vs_llamacpp, SHAPE:TYPE entries such as qwen3-30b-a3b:q4_k).
Needs numpy and the gguf package (the repo's .venv).
"""
import json
import os
import sys

import gguf
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
TOKENIZERS = os.path.join(HERE, "..", "..", "shared", "tokenizers")
Q = gguf.GGMLQuantizationType

SHAPES = {
    # arch, vocab, n_embd, n_layer, n_head, n_head_kv, head_dim, experts, used, expert_ff,
    # rope_base, eps, tokenizer, pre, bos, eos, qk_norm
    "qwen3-30b-a3b": ("qwen3moe", 151936, 2048, 48, 32, 4, 128, 128, 8, 768, 1e6, 1e-6, "qwen3",
                      "qwen2", 151643, 151645, True),
    "mixtral-8x7b": ("llama", 32000, 4096, 32, 32, 8, 128, 8, 2, 14336, 1e6, 1e-5, "llama2",
                     "default", 1, 2, False),
}

# bytes per block, elements per block, and where its f16 scales sit
BLOCK = {Q.Q4_K: (144, 256, (0, 2)), Q.Q6_K: (210, 256, (208,)), Q.Q8_0: (34, 32, (0,))}


def random_blocks(rng, qt, shape):
    """Random quantized rows of the given element shape (..., n_in), scales near 0.002."""
    nbytes, nelem, scale_offs = BLOCK[qt]
    *lead, n_in = shape
    assert n_in % nelem == 0, (shape, qt)
    n_blocks = int(np.prod(lead)) * (n_in // nelem)
    b = rng.integers(0, 256, size=(n_blocks, nbytes), dtype=np.uint8)
    d = (0.001 + rng.random(n_blocks, dtype=np.float32) * 0.002).astype(np.float16)
    for o in scale_offs:
        b[:, o:o + 2] = d.view(np.uint8).reshape(n_blocks, 2)
    return b.reshape(*lead, (n_in // nelem) * nbytes)


def main(shape, tname, n_layer, out):
    (arch, V, H, L_real, NH, NKV, D, E, EU, FF, base, eps, tokdir, pre, bos, eos,
     qk_norm) = SHAPES[shape]
    L = int(n_layer)
    if not 1 <= L <= L_real:
        sys.exit(f"N_LAYERS: 1..{L_real} for {shape}")
    main_t, head_t = {"q4_k": (Q.Q4_K, Q.Q6_K), "q8_0": (Q.Q8_0, Q.Q8_0)}[tname]
    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(out, arch, use_temp_file=True)
    w.add_name(f"{shape}-{L}-layers-random-{tname}")
    w.add_context_length(32768)
    w.add_embedding_length(H)
    w.add_block_count(L)
    w.add_feed_forward_length(FF)
    w.add_head_count(NH)
    w.add_head_count_kv(NKV)
    w.add_rope_freq_base(base)
    w.add_layer_norm_rms_eps(eps)
    w.add_key_length(D)
    w.add_value_length(D)
    w.add_expert_count(E)
    w.add_expert_used_count(EU)
    if arch == "qwen3moe":
        w.add_expert_feed_forward_length(FF)
    tok = json.load(open(os.path.join(TOKENIZERS, tokdir, "tokenizer.json"), encoding="utf-8"))
    toks, types = [f"[PAD{i}]" for i in range(V)], [gguf.TokenType.UNUSED] * V
    if tok["model"]["type"] == "BPE" and tokdir != "llama2":
        for t, i in tok["model"]["vocab"].items():
            toks[i], types[i] = t, gguf.TokenType.NORMAL
        for t in tok["added_tokens"]:
            toks[t["id"]], types[t["id"]] = t["content"], gguf.TokenType.CONTROL
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre(pre)
        w.add_token_list(toks)
        w.add_token_types(types)
        w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]])
    else:  # Llama 2's SentencePiece vocabulary
        for t, i in tok["model"]["vocab"].items():
            toks[i], types[i] = t, gguf.TokenType.NORMAL
        for t in tok["added_tokens"]:
            toks[t["id"]], types[t["id"]] = t["content"], gguf.TokenType.CONTROL
        types[0] = gguf.TokenType.UNKNOWN
        w.add_tokenizer_model("llama")
        w.add_token_list(toks)
        w.add_token_scores([0.0] * V)
        w.add_token_types(types)
    w.add_bos_token_id(bos)
    w.add_eos_token_id(eos)

    def mat(name, shape, qt):  # element shape (..., n_out, n_in); GGUF reverses it
        w.add_tensor(name, random_blocks(rng, qt, shape), raw_dtype=qt)

    def vec(name, n, ones=False):
        v = np.ones(n, np.float32) if ones else rng.standard_normal(n, dtype=np.float32) * 0.02
        w.add_tensor(name, v)

    mat("token_embd.weight", (V, H), main_t)
    vec("output_norm.weight", H, True)
    mat("output.weight", (V, H), head_t)
    for il in range(L):
        p = f"blk.{il}."
        vec(p + "attn_norm.weight", H, True)
        vec(p + "ffn_norm.weight", H, True)
        mat(p + "attn_q.weight", (NH * D, H), main_t)
        mat(p + "attn_k.weight", (NKV * D, H), main_t)
        mat(p + "attn_v.weight", (NKV * D, H), head_t)
        mat(p + "attn_output.weight", (H, NH * D), main_t)
        if qk_norm:
            vec(p + "attn_q_norm.weight", D, True)
            vec(p + "attn_k_norm.weight", D, True)
        w.add_tensor(p + "ffn_gate_inp.weight", rng.standard_normal((E, H), dtype=np.float32) * 0.05)
        mat(p + "ffn_gate_exps.weight", (E, FF, H), main_t)
        mat(p + "ffn_up_exps.weight", (E, FF, H), main_t)
        mat(p + "ffn_down_exps.weight", (E, H, FF), main_t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    if len(sys.argv) != 5 or sys.argv[1] not in SHAPES or sys.argv[2] not in ("q4_k", "q8_0"):
        sys.exit(__doc__)
    main(*sys.argv[1:])
