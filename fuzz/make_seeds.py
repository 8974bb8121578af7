#!/usr/bin/env python3
"""Seed corpora for the fuzz targets: small valid inputs (from the shared
fixtures and the tests' templates) and one hand-made input per hostile class
the readers must refuse. Usage: make_seeds.py OUT_DIR [SHARED_DIR]

Writes OUT_DIR/<target>/<name>; standard library only. The GGUF and
safetensors files are built byte by byte so that each can break exactly one
rule (lengths near 2^64, dimensions whose product overflows, ...)."""
import json
import os
import struct
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# ---- GGUF ----
U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 = range(13)
SCALAR = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f",
          BOOL: "<B", U64: "<Q", I64: "<q", F64: "<d"}


def gstr(s, n=None):
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(b) if n is None else n) + b


def gval(t, v, elem=None):
    if t == STRING:
        return gstr(v)
    if t == ARRAY:
        out = struct.pack("<IQ", elem, len(v))
        for x in v:
            out += gval(elem, x[1], x[0]) if elem == ARRAY else gval(elem, x)
        return out
    return struct.pack(SCALAR[t], v)


def gguf(kvs, tensors, data=b"", align=32, version=3, n_tensors=None, n_kv=None):
    """kvs: [(key, type, value[, elem])] or raw bytes; tensors: [(name, dims, type, offset)]."""
    out = struct.pack("<IIQQ", 0x46554747, version,
                      len(tensors) if n_tensors is None else n_tensors,
                      len(kvs) if n_kv is None else n_kv)
    for kv in kvs:
        if isinstance(kv, bytes):
            out += kv
            continue
        key, t, v, *elem = kv
        out += gstr(key) + struct.pack("<I", t) + gval(t, v, elem[0] if elem else None)
    for name, dims, ttype, offset in tensors:
        out += gstr(name) + struct.pack("<I", len(dims))
        out += b"".join(struct.pack("<Q", d) for d in dims)
        out += struct.pack("<IQ", ttype, offset)
    out += b"\0" * ((-len(out)) % align if align and align & (align - 1) == 0 else 0)
    return out + data


def tiny_llama_kvs(n_vocab=16):
    toks = ["<unk>", "<s>", "</s>"] + [f"<0x{i:02X}>" for i in range(4)] + \
        ["\u2581", "a", "b", "\u2581a", "ab", "\u2581ab", "c", "<|im_end|>", "x"][: n_vocab - 7]
    return [
        ("general.architecture", STRING, "llama"),
        ("llama.block_count", U32, 1),
        ("llama.context_length", U32, 64),
        ("llama.embedding_length", U32, 8),
        ("llama.feed_forward_length", U32, 16),
        ("llama.attention.head_count", U32, 2),
        ("llama.attention.head_count_kv", U32, 1),
        ("llama.rope.freq_base", F32, 10000.0),
        ("llama.attention.layer_norm_rms_epsilon", F32, 1e-5),
        ("tokenizer.ggml.model", STRING, "llama"),
        ("tokenizer.ggml.tokens", ARRAY, toks, STRING),
        ("tokenizer.ggml.scores", ARRAY, [float(-i) for i in range(len(toks))], F32),
        ("tokenizer.ggml.token_type", ARRAY, [2, 3, 3] + [6] * 4 + [1] * (len(toks) - 7), I32),
        ("tokenizer.ggml.bos_token_id", U32, 1),
        ("tokenizer.ggml.eos_token_id", U32, 2),
        ("tokenizer.chat_template", STRING,
         "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}"),
    ]


def gguf_seeds():
    f32 = lambda n: struct.pack(f"<{n}f", *([0.5] * n))
    kvs = tiny_llama_kvs()
    ok = gguf(kvs, [("token_embd.weight", [8, 16], 0, 0), ("output_norm.weight", [8], 0, 512)],
              f32(128) + f32(8))
    g = {
        "valid_tiny_llama.gguf": ok,
        "valid_v2_no_tensors.gguf": gguf([("a", U8, 1), ("b", STRING, "x")], [], version=2),
        "valid_q8_0.gguf": gguf([], [("t", [32, 2], 8, 0)], b"\1" * 68),
        "valid_nested_arrays.gguf": gguf([("n", ARRAY, [(U8, [1, 2]), (U8, [3])], ARRAY)], []),
        # dimensions whose product overflows 64 bits (each one is allowed alone)
        "dims_product_overflows.gguf": gguf([], [("t", [1 << 40, 1 << 40, 1 << 40, 1 << 40], 0, 0)],
                                            f32(8)),
        "dims_product_wraps_to_zero.gguf": gguf([], [("t", [1 << 32, 1 << 32, 4], 0, 0)], f32(8)),
        "dims_product_wraps_small.gguf": gguf([], [("t", [(1 << 34) + 1, 1 << 31, 1 << 33], 0, 0)],
                                              f32(8)),
        "five_dims.gguf": gguf([], [("t", [1, 1, 1, 1, 1], 0, 0)], f32(1)),
        "zero_dims.gguf": gguf([], [("t", [], 0, 0)], f32(1)),
        "offset_past_end.gguf": gguf([], [("t", [4], 0, 1 << 62)], f32(4)),
        "offset_plus_size_wraps.gguf": gguf([], [("t", [4], 0, (1 << 64) - 32)], f32(4)),
        "overlapping_tensors.gguf": gguf([], [("a", [8], 0, 0), ("b", [8], 0, 0)], f32(8)),
        "duplicate_tensor.gguf": gguf([], [("a", [8], 0, 0), ("a", [8], 0, 32)], f32(16)),
        "unknown_tensor_type.gguf": gguf([], [("t", [8], 99, 0)], f32(8)),
        "string_len_near_2_64.gguf": gguf([b"".join([gstr("k"), struct.pack("<I", STRING),
                                                     struct.pack("<Q", (1 << 64) - 1), b"x"])], []),
        "key_len_near_2_64.gguf": gguf([gstr(b"k", (1 << 64) - 8) + struct.pack("<I", U8) + b"\1"], []),
        "array_len_near_2_64.gguf": gguf([gstr("k") + struct.pack("<IIQ", ARRAY, U32, (1 << 64) - 1)],
                                         []),
        "array_of_strings_len_huge.gguf": gguf(
            [gstr("k") + struct.pack("<IIQ", ARRAY, STRING, 1 << 61)], []),
        "deeply_nested_arrays.gguf": gguf([gstr("k") + struct.pack("<IIQ", ARRAY, ARRAY, 1) * 40], []),
        "bad_value_type.gguf": gguf([gstr("k") + struct.pack("<I", 77) + b"\0" * 8], []),
        "bad_array_elem_type.gguf": gguf([gstr("k") + struct.pack("<IIQ", ARRAY, 13, 1)], []),
        "bool_value_7.gguf": gguf([gstr("k") + struct.pack("<IB", BOOL, 7)], []),
        "duplicate_keys.gguf": gguf([("a", U8, 1), ("a", U8, 2)], []),
        "alignment_zero.gguf": gguf([("general.alignment", U32, 0)], [("t", [8], 0, 0)], f32(8),
                                    align=0),
        "alignment_not_pow2.gguf": gguf([("general.alignment", U32, 24)], [("t", [8], 0, 0)],
                                        f32(8), align=0),
        "alignment_as_string.gguf": gguf([("general.alignment", STRING, "32")], []),
        "tensor_count_huge.gguf": gguf([], [], n_tensors=(1 << 64) - 1),
        "kv_count_negative.gguf": gguf([], [], n_kv=(1 << 64) - 1),
        "bad_magic.gguf": b"GGUG" + ok[4:],
        "version_1.gguf": gguf([], [], version=1),
        "truncated_header.gguf": ok[:20],
        "truncated_data.gguf": ok[:-100],
        # vocabulary sizes that disagree: scores and types shorter than tokens,
        # ids past the end, and an embedding narrower than the vocabulary
        "vocab_arrays_disagree.gguf": gguf(
            [kv if kv[0] != "tokenizer.ggml.scores" else (kv[0], ARRAY, [0.0], F32) for kv in kvs] +
            [("tokenizer.ggml.padding_token_id", I32, -5)], []),
        "vocab_types_wrong_elem.gguf": gguf(
            [kv if kv[0] != "tokenizer.ggml.token_type" else (kv[0], ARRAY, ["x"] * 16, STRING)
             for kv in kvs], []),
        "vocab_wider_than_embedding.gguf": gguf(
            tiny_llama_kvs(), [("token_embd.weight", [8, 4], 0, 0)], f32(32)),
        "vocab_bos_negative.gguf": gguf(
            [kv if kv[0] != "tokenizer.ggml.bos_token_id" else (kv[0], I32, -1) for kv in kvs], []),
        "config_negative_counts.gguf": gguf(
            [kv if kv[0] != "llama.block_count" else (kv[0], I32, -3) for kv in kvs], []),
        "config_huge_counts.gguf": gguf(
            [kv if kv[0] != "llama.embedding_length" else (kv[0], U64, (1 << 63) + 1) for kv in kvs],
            []),
    }
    return g


# ---- safetensors ----
def st(header, data=b"", n_header=None):
    h = json.dumps(header).encode() if not isinstance(header, bytes) else header
    return struct.pack("<Q", len(h) if n_header is None else n_header) + h + data


def safetensors_seeds():
    d = b"\0" * 64
    return {
        "valid.safetensors": st({"a": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]},
                                 "b": {"dtype": "BF16", "shape": [8], "data_offsets": [16, 32]},
                                 "__metadata__": {"format": "pt"}}, d[:32]),
        "valid_scalar.safetensors": st({"s": {"dtype": "F16", "shape": [], "data_offsets": [0, 2]}},
                                       d[:2]),
        "valid_fp8.safetensors": st({"w": {"dtype": "F8_E4M3", "shape": [4, 4], "data_offsets": [0, 16]},
                                     "w_scale_inv": {"dtype": "F32", "shape": [1, 1],
                                                     "data_offsets": [16, 20]},
                                     "e": {"dtype": "F8_E5M2", "shape": [8], "data_offsets": [20, 28]}},
                                    d[:28]),
        "header_len_huge.safetensors": st({}, n_header=(1 << 64) - 1),
        "header_len_past_end.safetensors": st({}, n_header=1000),
        "offsets_past_end.safetensors": st({"a": {"dtype": "F32", "shape": [4],
                                                  "data_offsets": [0, 1 << 62]}}, d),
        "offsets_reversed.safetensors": st({"a": {"dtype": "F32", "shape": [0],
                                                  "data_offsets": [16, 0]}}, d),
        "overlapping.safetensors": st({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
                                       "b": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]}},
                                      d),
        "shape_overflows.safetensors": st({"a": {"dtype": "F32",
                                                 "shape": [1 << 32, 1 << 32, 1 << 32],
                                                 "data_offsets": [0, 0]}}, d),
        "shape_negative.safetensors": st({"a": {"dtype": "F32", "shape": [-4, -1],
                                                "data_offsets": [0, 16]}}, d),
        "shape_mismatch.safetensors": st({"a": {"dtype": "F32", "shape": [3],
                                                "data_offsets": [0, 16]}}, d),
        "dtype_unknown.safetensors": st({"a": {"dtype": "Q4", "shape": [4], "data_offsets": [0, 2]}},
                                        d),
        "wrong_types.safetensors": st({"a": {"dtype": 5, "shape": "x", "data_offsets": {}}}, d),
        "duplicate_keys.safetensors": st(
            b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},'
            b'"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}', d),
        "deep_nesting.safetensors": st(b"[" * 5000 + b"]" * 5000),
        "not_json.safetensors": st(b"\xff\xfe{", d),
    }


# ---- tokenizer.json (small ones cut from the shared tokenizers) ----
def cut_tokenizer(path, n_keep=300):
    j = json.load(open(path, encoding="utf-8"))
    m = j["model"]
    vocab = {t: i for t, i in m["vocab"].items() if i < n_keep}
    merges = []
    for mg in m["merges"]:
        a, b = mg.split(" ", 1) if isinstance(mg, str) else mg
        if a in vocab and b in vocab and a + b in vocab:
            merges.append(mg)
    m["vocab"], m["merges"] = vocab, merges
    j["added_tokens"] = [dict(a, id=n_keep + k) for k, a in enumerate(j.get("added_tokens", [])[:4])]
    return j


def tokenizer_seeds(shared):
    texts = ["Hello world! 123 ünïcödé 漢字 🙂\n\n  tabs\t", "<|im_start|>user\nhi<|im_end|>",
             "<s>[INST] x [/INST]", "don't  I'll 1234567 \r\n"]
    out = {f"text_{k}.txt": t.encode() for k, t in enumerate(texts)}
    out["text_invalid_utf8.txt"] = b"ab\xff\xc3(\xe2\x82"
    for name in ("qwen3", "llama3", "llama2"):
        p = Path(shared) / "tokenizers" / name / "tokenizer.json"
        if not p.exists():
            continue
        j = cut_tokenizer(p)
        body = json.dumps(j, ensure_ascii=False).encode()
        out[f"{name}_small.json"] = body + b"\0" + texts[0].encode()
        bad = json.loads(body)
        first = next(iter(bad["model"]["vocab"]))
        bad["model"]["vocab"][first] = -7  # a negative id
        out[f"{name}_negative_id.json"] = json.dumps(bad).encode() + b"\0abc"
        bad = json.loads(body)
        bad["model"]["vocab"][first] = 1 << 40  # an id past int32
        out[f"{name}_huge_id.json"] = json.dumps(bad).encode() + b"\0abc"
        bad = json.loads(body)
        bad["added_tokens"] = [{"id": -1, "content": "<x>", "special": True}]
        out[f"{name}_added_negative.json"] = json.dumps(bad).encode() + b"\0<x>"
        bad = json.loads(body)
        bad["pre_tokenizer"] = {"type": "Split", "pattern": {"Regex": "(a+)+$"}, "behavior": "Isolated"}
        out[f"{name}_redos.json"] = json.dumps(bad).encode() + b"\0" + b"a" * 64 + b"!"
    return out


# ---- Jinja templates ----
def jinja_seeds(shared):
    out = {}
    for p in sorted((ROOT / "tests" / "templates").glob("*.jinja")):
        out[p.name] = p.read_bytes()
    for name in ("qwen3", "llama3", "llama2"):
        p = Path(shared) / "tokenizers" / name / "tokenizer_config.json"
        if p.exists():
            t = json.load(open(p, encoding="utf-8")).get("chat_template")
            if isinstance(t, str):
                out[f"{name}.jinja"] = t.encode()
    hostile = {
        "range_huge": "{% for i in range(10**12) %}x{% endfor %}",
        "nested_loops": "{% for a in range(1000) %}{% for b in range(1000) %}{{ a }}{% endfor %}{% endfor %}",
        "string_doubling": "{% set ns = namespace(s='ab') %}{% for i in range(64) %}"
                           "{% set ns.s = ns.s + ns.s %}{% endfor %}{{ ns.s | length }}",
        "string_times": "{{ 'x' * 10**12 }}",
        "recursive_macro": "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
        "deep_parens": "{{ " + "(" * 500 + "1" + ")" * 500 + " }}",
        "deep_ifs": "{% if 1 %}" * 300 + "{% endif %}" * 300,
        "namespace_self": "{% set ns = namespace(a=1) %}{% set ns.a = ns %}{{ ns | tojson }}",
        "list_self": "{% set l = [1] %}{% set _ = l.append(l) %}{{ l | tojson }}",
        "filters": "{{ messages | map(attribute='content') | join(', ') | upper | replace('A', 'b') "
                   "| trim | list | reverse | first }}{{ tools | tojson(indent=2) }}",
        "slices": "{{ messages[::-1][0].content[1:-1] }}{{ 'abc'[10**18:] }}{{ (1, 2)[-5] }}",
        "raise": "{{ raise_exception('no') }}",
        "unclosed": "{% for m in messages %}{{ m",
        "int_overflow": "{{ 9223372036854775807 + 1 }}{{ -9223372036854775808 // -1 }}"
                        "{{ 9223372036854775807 * 2 }}{{ 2 ** 70 }}{{ 5 % 0 }}",
        "with_vars": "{{ x }}{% for k, v in d.items() %}{{ k }}={{ v }}{% endfor %}\0"
                     '{"x": [1, {"y": null}], "d": {"a": 1, "b": [2]}, "messages": 5}',
    }
    for k, v in hostile.items():
        out[k + ".jinja"] = v.encode()
    return out


# ---- request bodies ----
def request_seeds():
    msgs = [{"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "Hi"}]}]
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    bodies = {
        "chat": {"model": "m", "messages": msgs, "max_tokens": 8, "temperature": 0.5, "top_p": 0.9,
                 "stop": ["\n", "END"], "seed": 3, "n": 2, "logprobs": True, "top_logprobs": 3,
                 "stream": True, "stream_options": {"include_usage": True}, "tools": tools,
                 "chat_template_kwargs": {"enable_thinking": False}},
        "completion": {"model": "m", "prompt": "Once", "max_tokens": 4, "echo": False,
                       "logit_bias": {"11": -100}, "presence_penalty": 1.0},
        "completion_list": {"model": "m", "prompt": ["a", "b", [1, 2, 3]], "n": 3},
        "completion_echo": {"model": "m", "prompt": [[1, 2], [3, 4, 5]], "max_tokens": 0, "echo": True,
                            "logprobs": 2, "prompt_logprobs": 1, "min_tokens": 0, "ignore_eos": True},
        "guided": {"model": "m", "messages": msgs, "guided_choice": ["yes", "no \"way\""],
                   "guided_regex": "(a|b\\d{2,3})+[^x-z]?.", "guided_json": "{\"type\": \"integer\"}",
                   "structured_outputs": {"choice": ["x"], "json_object": True}},
        "token_controls": {"model": "m", "messages": msgs, "max_tokens": 4, "min_tokens": 3,
                           "logit_bias": {"0": 100, "151000": -100.0, "007": 1, "-3": 1, "x": "y"}},
        "ollama_chat": {"model": "m:latest", "messages": msgs, "stream": False,
                        "options": {"num_predict": -1, "top_k": 40, "num_ctx": 256,
                                    "repeat_last_n": -1, "stop": ["x"]}, "format": "json"},
        "ollama_generate": {"model": "m", "prompt": "Why?", "system": "s", "raw": False,
                            "options": {"temperature": 0, "num_predict": -2}, "spec": "ngram",
                            "draft_max": 8},
        "ollama_logprobs": {"model": "m", "messages": msgs, "logprobs": True, "top_logprobs": 20},
        "chat_echo": {"model": "m", "messages": msgs, "echo": True, "add_generation_prompt": False,
                      "continue_final_message": False},
        "suffix": {"model": "m", "prompt": "def f(", "suffix": "\n    return x\n", "max_tokens": 8},
        "infill": {"input_prefix": "a", "input_suffix": "b", "prompt": "c", "n_predict": -1,
                   "input_extra": [{"filename": "x.py", "text": "y"}, {"text": 3}],
                   "json_schema": {"type": "string"}, "min_p": 0.05, "repeat_last_n": -1},
        "completion": {"prompt": [1, 2, 151668], "n_predict": 4, "stop": ["\n"], "n_probs": 0,
                       "grammar": "root ::= [a-z]+", "cache_prompt": True},
        "ollama_show": {"name": "m"},
        "path_traversal": {"model": "../../../etc/passwd", "messages": msgs},
        "n_at_limit": {"model": "m", "prompt": "x", "n": 8, "max_tokens": 1},
        "n_past_limit": {"model": "m", "prompt": "x", "n": 1 << 40},
        "n_negative": {"model": "m", "prompt": "x", "n": -1},
        "max_tokens_huge": {"model": "m", "prompt": "x", "max_tokens": (1 << 63) - 1},
        "max_tokens_negative": {"model": "m", "prompt": "x", "max_tokens": -(1 << 62)},
        "top_logprobs_huge": {"model": "m", "messages": msgs, "logprobs": True, "top_logprobs": 99999},
        "kwargs_override_messages": {"model": "m", "messages": msgs,
                                     "chat_template_kwargs": {"messages": [], "range": 1}},
        "stop_many": {"model": "m", "prompt": "x", "stop": ["a"] * 100},
        "prompt_ids_out_of_vocab": {"model": "m", "prompt": [-1, 1 << 31, 999999999]},
        "wrong_types": {"model": 5, "messages": "hi", "temperature": "hot", "stream": "yes"},
        "message_roles": {"model": "m", "messages": [{"role": "wizard", "content": None},
                                                     {"role": "user"}]},
        "responses": {"model": "m", "instructions": "Be brief.", "max_output_tokens": 8,
                      "input": [{"role": "user", "content": [{"type": "input_text", "text": "Hi"}]},
                                {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
                                {"type": "function_call_output", "call_id": "c", "output": "ok"},
                                {"type": "reasoning", "summary": []}],
                      "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}],
                      "tool_choice": {"type": "function", "name": "f"}, "truncation": "auto",
                      "include": ["message.output_text.logprobs"], "top_logprobs": 2, "store": False,
                      "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}}}},
        "responses_long": {"model": "m", "truncation": "auto",
                           "input": [{"role": "user", "content": "word " * 300}] * 4},
    }
    out = {k + ".json": json.dumps(v).encode() for k, v in bodies.items()}
    out["deep_nesting.json"] = b'{"model":"m","messages":' + b"[" * 100 + b"]" * 100 + b"}"
    out["invalid_utf8.json"] = b'{"model":"m","prompt":"a\xff\xfeb"}'
    out["not_object.json"] = b"[1,2,3]"
    out["truncated.json"] = b'{"model":"m","messages":[{"role":"us'
    return out


def detokenizer_seeds():
    import random
    rnd = random.Random(17)
    out = {}
    for k in range(8):
        out[f"ids_{k}.bin"] = bytes(rnd.randrange(256) for _ in range(2 * rnd.randrange(4, 64) + 1))
    # byte-fallback tokens <0xE6> <0xBC> <0xA2> (Llama 2 ids 233, 191, 165) split a character
    out["split_utf8.bin"] = b"\0" + struct.pack("<6H", 233, 191, 165, 233, 191, 3)
    return out


def main():
    out = Path(sys.argv[1])
    shared = sys.argv[2] if len(sys.argv) > 2 else str(ROOT.parent / "shared")
    sets = {"gguf": gguf_seeds(), "safetensors": safetensors_seeds(),
            "tokenizer": tokenizer_seeds(shared), "jinja": jinja_seeds(shared),
            "request": request_seeds(), "detokenizer": detokenizer_seeds()}
    for target, files in sets.items():
        d = out / target
        d.mkdir(parents=True, exist_ok=True)
        for name, data in files.items():
            (d / name).write_bytes(data)
    print(f"seeds: {', '.join(f'{t} {len(f)}' for t, f in sets.items())} in {out}")


if __name__ == "__main__":
    main()
