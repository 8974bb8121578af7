#!/usr/bin/env python3
"""Write a random-weight GGUF with the shape of a real mixture-of-experts model (or of a Granite),
for speed work.

Usage: make_shaped_moe.py SHAPE TYPE N_LAYERS OUT.gguf
  SHAPE: qwen3-30b-a3b (128 experts, 8 per token, 2048 wide, 768 per expert: Qwen3-30B-A3B's
         layer), mixtral-8x7b (8 experts, 2 per token, 4096 wide, 14336 per expert),
         granite3-3b-a800m (granitemoe: 40 experts, 8 per token, 1536 wide, 512 per expert,
         32 layers) or granite3-2b (dense granite: 2048 wide, 8192 ff, 40 layers; the shape
         ../shared/tools/make_shaped_gguf.py lacks). The Granites carry granite-3.1's four
         multipliers (llama.cpp's granite.* keys) and tie the head to the embedding.
  TYPE:  q4_k (the experts and attention Q4_K, the output Q6_K: what a Q4_K_M file holds for most
         of its bytes; a tied embedding Q6_K, as llama-quantize makes it) or q8_0 (Q8_0
         throughout).
  N_LAYERS: the real model's layers are all alike, so fewer of them (the first N) measure the
         per-layer cost in less memory; the embedding and the output head are whole. `all`: the
         real model's count.
The weights are random blocks with sane f16 scales (speed does not depend on their values), the
router is random f32, so tokens spread over the experts as in a trained model. The tokenizer
comes from ../shared/tokenizers/ (Qwen's for Qwen3, Llama 3's for Mixtral) or, for the
Granites, from the default model (SmolLM2's 49,152 tokens, the StarCoder-style BPE that
Granite's 49,155 extend; pre-tokenizer "refact", as Granite's GGUFs name it). Both wick and
llama.cpp run the file (scripts/bench_vs_llamacpp, entries such as qwen3-30b-a3b-moe12:q4_k or
granite3-3b-a800m:q4_k).
Needs numpy and the gguf package (the repo's .venv).
"""
import json
import os
import subprocess
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
    "granite3-3b-a800m": ("granitemoe", 49155, 1536, 32, 24, 8, 64, 40, 8, 512, 1e7, 1e-6,
                          "smollm2", "refact", 0, 0, False),
    "granite3-2b": ("granite", 49155, 2048, 40, 32, 8, 64, 0, 0, 8192, 5e6, 1e-5, "smollm2",
                    "refact", 0, 0, False),
}
# granite-3.1's embedding, residual and attention multipliers and logits divisor
GRANITE_SCALES = {"granite": (12.0, 0.22, 0.015625, 8.0), "granitemoe": (12.0, 0.22, 0.015625, 6.0)}

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
    L = L_real if n_layer == "all" else int(n_layer)
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
    if E:
        w.add_expert_count(E)
        w.add_expert_used_count(EU)
    if arch == "qwen3moe":
        w.add_expert_feed_forward_length(FF)
    granite = arch in GRANITE_SCALES
    if granite:
        emb, res, att, logit = GRANITE_SCALES[arch]
        w.add_embedding_scale(emb)
        w.add_residual_scale(res)
        w.add_attention_scale(att)
        w.add_logit_scale(logit)
    toks, types = [f"[PAD{i}]" for i in range(V)], [gguf.TokenType.UNUSED] * V
    if tokdir != "smollm2":
        tok = json.load(open(os.path.join(TOKENIZERS, tokdir, "tokenizer.json"), encoding="utf-8"))
    if tokdir == "smollm2":  # the default model's tokens and merges
        path = subprocess.run([os.path.join(HERE, "fetch_model")], capture_output=True, text=True,
                              check=True).stdout.strip()
        r = gguf.GGUFReader(path)
        for i, (t, ty) in enumerate(zip(r.fields["tokenizer.ggml.tokens"].contents(),
                                        r.fields["tokenizer.ggml.token_type"].contents())):
            toks[i], types[i] = t, ty
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre(pre)
        w.add_token_list(toks)
        w.add_token_types(types)
        w.add_token_merges(r.fields["tokenizer.ggml.merges"].contents())
    elif tokdir == "qwen3":
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

    mat("token_embd.weight", (V, H), head_t if granite else main_t)
    vec("output_norm.weight", H, True)
    if not granite:  # the Granites tie their head to the embedding
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
        if not E:
            mat(p + "ffn_gate.weight", (FF, H), main_t)
            mat(p + "ffn_up.weight", (FF, H), main_t)
            mat(p + "ffn_down.weight", (H, FF), main_t)
            continue
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
