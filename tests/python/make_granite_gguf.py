#!/usr/bin/env python3
"""Writes the tiny Granite fixture (tests/fixtures/tiny-models/granite) as llama.cpp lays Granite
out in GGUF, with the reference `gguf` package (not wick's converter): its key names for the
multipliers (GGUFWriter.add_embedding_scale, add_residual_scale, add_attention_scale,
add_logit_scale), llama-family tensor names, q/k rows interleaved per head (each head's two
RoPE halves alternate, llama.cpp's permute), no output.weight (tied). f32, so wick must give
the safetensors' logits bit for bit. The same for the GraniteMoe fixture beside it
(OUT/granitemoe-f32.gguf), as llama.cpp's converter splits its experts: general.architecture
"granitemoe", each layer's stacked input_linear [experts, 2 ff, hidden] cut into
ffn_gate_exps (its first ff rows) and ffn_up_exps, output_linear as ffn_down_exps, the router
as ffn_gate_inp.

Also OUT/refact-tokenizer.gguf: the default model's tokenizer with tokenizer.ggml.pre "refact"
(what Granite's GGUF files name their pre-tokenizer), tokens only.

usage: make_granite_gguf.py FIXTURE_DIR DEFAULT_MODEL_GGUF OUT_DIR
"""
import json
import os
import sys

import gguf
import numpy as np
from safetensors.numpy import load_file

import gguf_meta


def interleave_heads(w: np.ndarray, n_head: int) -> np.ndarray:
    rows, cols = w.shape
    hd = rows // n_head
    return w.reshape(n_head, 2, hd // 2, cols).swapaxes(1, 2).reshape(rows, cols)


def write_granite_gguf(fixture: str, path: str, tokenizer_from: str | None = None,
                       chat_template: str | None = None) -> None:
    """The fixture as llama.cpp lays it out; with tokenizer_from (a GGUF), that file's tokenizer
    under the pre-tokenizer name "refact" and the embedding grown to its vocabulary (the
    fixture's rows first, random ones after), and chat_template as tokenizer.chat_template."""
    cfg = json.load(open(os.path.join(fixture, "config.json")))
    t = load_file(os.path.join(fixture, "model.safetensors"))
    n_head, n_head_kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    moe = cfg["model_type"] == "granitemoe"
    w = gguf.GGUFWriter(path, arch=cfg["model_type"])
    if tokenizer_from:
        n_vocab = copy_tokenizer(gguf_meta.read(tokenizer_from), w)
        emb = t["model.embed_tokens.weight"]
        grown = np.random.default_rng(7).standard_normal((n_vocab, emb.shape[1])) * 0.08
        grown[: emb.shape[0]] = emb
        t["model.embed_tokens.weight"] = grown.astype(np.float32)
        cfg["vocab_size"] = n_vocab
    if chat_template is not None:
        w.add_chat_template(chat_template)
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_rope_freq_base(cfg["rope_theta"])
    w.add_rope_dimension_count(cfg["hidden_size"] // n_head)
    w.add_vocab_size(cfg["vocab_size"])
    w.add_embedding_scale(cfg["embedding_multiplier"])
    w.add_residual_scale(cfg["residual_multiplier"])
    w.add_attention_scale(cfg["attention_multiplier"])
    w.add_logit_scale(cfg["logits_scaling"])
    if moe:
        w.add_expert_count(cfg["num_local_experts"])
        w.add_expert_used_count(cfg["num_experts_per_tok"])
    w.add_tensor("token_embd.weight", t["model.embed_tokens.weight"])
    w.add_tensor("output_norm.weight", t["model.norm.weight"])
    names = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
             "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
             "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
             "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}
    for il in range(cfg["num_hidden_layers"]):
        for hf, gg in names.items():
            if hf.startswith("mlp.") and moe:
                continue
            a = t[f"model.layers.{il}.{hf}.weight"]
            if gg == "attn_q":
                a = interleave_heads(a, n_head)
            elif gg == "attn_k":
                a = interleave_heads(a, n_head_kv)
            w.add_tensor(f"blk.{il}.{gg}.weight", np.ascontiguousarray(a))
        if moe:
            p, ff = f"model.layers.{il}.block_sparse_moe.", cfg["intermediate_size"]
            stacked = t[p + "input_linear.weight"]  # [experts, 2 ff, hidden]: gate rows, up rows
            w.add_tensor(f"blk.{il}.ffn_gate_inp.weight", t[p + "router.layer.weight"])
            w.add_tensor(f"blk.{il}.ffn_gate_exps.weight", np.ascontiguousarray(stacked[:, :ff]))
            w.add_tensor(f"blk.{il}.ffn_up_exps.weight", np.ascontiguousarray(stacked[:, ff:]))
            w.add_tensor(f"blk.{il}.ffn_down_exps.weight", t[p + "output_linear.weight"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def copy_tokenizer(r: gguf_meta.Meta, w: gguf.GGUFWriter) -> int:
    """r's BPE tokenizer into w, its pre-tokenizer named "refact"; returns the vocabulary size."""
    for key in ("tokenizer.ggml.model", "tokenizer.ggml.tokens", "tokenizer.ggml.token_type",
                "tokenizer.ggml.merges", "tokenizer.ggml.bos_token_id",
                "tokenizer.ggml.eos_token_id"):
        v, t = r.fields[key], r.types[key]
        if t[0] == gguf.GGUFValueType.ARRAY:
            w.add_array(key, v)
        else:
            w.add_key_value(key, v, t[0])
    w.add_string("tokenizer.ggml.pre", "refact")
    return len(r.fields["tokenizer.ggml.tokens"])


def write_refact_tokenizer(model: str, out: str) -> None:
    w = gguf.GGUFWriter(os.path.join(out, "refact-tokenizer.gguf"), arch="llama")
    copy_tokenizer(gguf_meta.read(model), w)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main(fixture: str, model: str, out: str) -> None:
    os.makedirs(out, exist_ok=True)
    write_granite_gguf(fixture, os.path.join(out, "granite-f32.gguf"))
    write_granite_gguf(os.path.join(os.path.dirname(os.path.abspath(fixture)), "granitemoe"),
                       os.path.join(out, "granitemoe-f32.gguf"))
    if os.path.exists(model):
        write_refact_tokenizer(model, out)


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    main(*sys.argv[1:])
