#!/usr/bin/env python3
"""Text conformance fixtures from the reference libraries.

Writes OUT/corpus.json (several thousand strings) and, per tokenizer,
OUT/<name>.expect.json with what HF `tokenizers` returns:
  plain:  encode(s, add_special_tokens=False) with special-token text NOT parsed
  parsed: encode(s, add_special_tokens=True) with special-token text parsed
  decode: decode(plain, skip_special_tokens=False)
  decode_skip: decode(parsed, skip_special_tokens=True)
Tokenizers: the three in ../shared/tokenizers, SmolLM2 (its GGUF vocabulary
rebuilt as a tokenizer.json: GPT-2 byte-level BPE with individual digits, as
SmolLM2 ships it) and llama2 written as a GGUF with merge scores
(OUT/llama2-vocab.gguf), checked against llama2's tokenizer.json.

usage: make_text_fixtures.py SHARED_DIR SMOLLM2_GGUF OUT
"""
import json
import os
import random
import sys

import gguf
import numpy as np
from tokenizers import Tokenizer

import gguf_meta


def corpus():
    rng = random.Random(20261122)
    words = {
        "en": "the quick brown fox jumps over the lazy dog it's we're they'll I'd can't won't".split(),
        "fr": "élève naïve café où déjà garçon Noël cœur français être".split(),
        "de": "Straße Größe Mädchen über schön Fußgänger Äpfel Öl".split(),
        "ru": "привет мир как дела Москва съешь ещё этих мягких булок".split(),
        "el": "καλημέρα κόσμε ελληνικά γλώσσα".split(),
        "zh": "你好 世界 中文 分词 测试 机器学习 人工智能 的 了 是".split(),
        "ja": "こんにちは 世界 日本語 カタカナ ひらがな 東京 漢字".split(),
        "ko": "안녕하세요 세계 한국어 테스트".split(),
        "ar": "مرحبا بالعالم العربية اختبار".split(),
        "he": "שלום עולם עברית".split(),
        "hi": "नमस्ते दुनिया हिन्दी परीक्षण".split(),
        "th": "สวัสดี ชาวโลก ภาษาไทย".split(),
        "emoji": ["😀", "👍🏽", "👨‍👩‍👧‍👦", "🏳️‍🌈", "🇫🇷", "❤️", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "𐍈", "🀄", "𝄞"],
    }
    code = [
        "def f(x):\n    return x ** 2\n",
        "for (int i = 0; i < n; ++i) {\n\tsum += a[i];\n}",
        "SELECT * FROM users WHERE id = 42;",
        "<div class=\"a\">Hello</div>",
        "x = {'a': 1, \"b\": [2, 3]}  # comment",
        "fn main() { println!(\"{}\", 1_000_000); }",
        "if (a && b || !c) return -1;\r\n",
        "   leading spaces", "trailing spaces   ", "\n\n\nnewlines\n\n", "\t\ttabs\tand\ttabs",
        "mixed \t \n \r\n whitespace", "", " ", "  ", "\n", "\t", "\u00a0nbsp\u00a0", "\u3000ideographic space",
        "12345678901234567890", "3.14159 2,718 1e-10 0x1F -42", "2026-11-22T11:14:00Z",
        "a" * 300, "x" * 1000 + "y", "supercalifragilisticexpialidocious" * 20,
        "ab" * 200, "😀" * 50, "你" * 100, "Ğ" * 10,
    ]
    specials = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|begin_of_text|>", "<|eot_id|>",
                "<s>", "</s>", "<unk>", "<think>", "</think>", "<tool_call>", "<|start_header_id|>"]
    out = list(code)
    out += [f"{s}user\nhello{s}" for s in specials]
    out += ["<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n",
            "<s>[INST] hi [/INST]", "text<|endoftext|>more", "<<|im_end|>>", "<|im_end", "im_end|>"]
    all_words = [w for ws in words.values() for w in ws]
    puncts = [".", ",", "!", "?", ";", ":", "...", " - ", "—", "'", "\"", "(", ")", "[", "]", "{", "}", "/", "\\", "@", "#", "$", "%", "^", "&", "*"]
    seps = [" ", " ", " ", "  ", "\n", "\t", "\n\n", " \n", "", "   "]
    for lang, ws in words.items():
        for _ in range(150):
            n = rng.randint(1, 14)
            parts = []
            for _ in range(n):
                parts.append(rng.choice(ws))
                if rng.random() < 0.2: parts.append(rng.choice(puncts))
                if rng.random() < 0.1: parts.append(str(rng.randint(0, 10 ** rng.randint(1, 9))))
                parts.append(rng.choice(seps))
            out.append("".join(parts))
    for _ in range(800):  # mixed scripts, code fragments, specials, numbers
        n = rng.randint(1, 20)
        parts = []
        for _ in range(n):
            r = rng.random()
            if r < 0.55: parts.append(rng.choice(all_words))
            elif r < 0.7: parts.append(rng.choice(puncts))
            elif r < 0.8: parts.append(str(rng.randint(0, 10 ** rng.randint(1, 12))))
            elif r < 0.87: parts.append(rng.choice(code)[: rng.randint(0, 30)])
            elif r < 0.92: parts.append(rng.choice(specials))
            else: parts.append(chr(rng.choice([rng.randint(0x20, 0x7e), rng.randint(0xa0, 0x2fff), rng.randint(0x3000, 0x9fff), rng.randint(0x1f300, 0x1faff), rng.randint(0x10000, 0x1ffff)])))
            parts.append(rng.choice(seps))
        out.append("".join(parts))
    for _ in range(300):  # random code points, including rare planes
        n = rng.randint(1, 30)
        s = ""
        for _ in range(n):
            cp = rng.choice([rng.randint(0x20, 0x7f), rng.randint(0x80, 0x7ff), rng.randint(0x800, 0xd7ff), rng.randint(0xe000, 0xfffd), rng.randint(0x10000, 0x10ffff)])
            s += chr(cp)
        out.append(s)
    return out


def skip(msg):
    """A missing input: a printed skip, or under CI (CI=true or CI=1) an error, exit 1."""
    if os.environ.get("CI", "").lower() in ("true", "1"):
        sys.exit(f"error: {msg} (CI={os.environ['CI']}: under CI a skipped reference fails)")
    print(f"skip: {msg}")


def smollm2_tokenizer_json(path):
    f = gguf_meta.read(path).fields
    toks, types, merges = (f[f"tokenizer.ggml.{k}"] for k in ("tokens", "token_type", "merges"))
    added = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for i, (t, ty) in enumerate(zip(toks, types)) if ty == 3]
    return json.dumps({
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": True},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}]},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                  "vocab": {t: i for i, t in enumerate(toks)}, "merges": merges}})


def llama2_gguf(tokenizer_json, out):
    """Llama 2's vocabulary as a GGUF SentencePiece vocabulary: scores order
    the merges as the merges list does (a merged token's score is minus its
    merge rank)."""
    j = json.load(open(tokenizer_json))
    vocab = j["model"]["vocab"]
    toks = [None] * len(vocab)
    for t, i in vocab.items(): toks[i] = t
    scores = np.full(len(toks), -1e9, dtype=np.float32)
    for i, t in enumerate(toks):
        if len(t) == 1: scores[i] = 0.0
    for rank, m in enumerate(j["model"]["merges"]):
        a, b = m.split(" ", 1) if isinstance(m, str) else m
        i = vocab.get(a + b)
        if i is not None and scores[i] < -1e8: scores[i] = -float(rank + 1)
    types = [3 if t in ("<s>", "</s>") else 2 if t == "<unk>" else 6 if t.startswith("<0x") and len(t) == 6 else 1 for t in toks]
    w = gguf.GGUFWriter(out, arch="llama")
    w.add_tokenizer_model("llama")
    w.add_token_list(toks)
    w.add_token_scores(scores.tolist())
    w.add_token_types(types)
    w.add_bos_token_id(1); w.add_eos_token_id(2); w.add_unk_token_id(0)
    w.add_add_bos_token(True); w.add_add_eos_token(False)
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()


def expect(tok, texts):
    rows = []
    for s in texts:
        tok.encode_special_tokens = True
        plain = tok.encode(s, add_special_tokens=False).ids
        tok.encode_special_tokens = False
        parsed = tok.encode(s, add_special_tokens=True).ids
        rows.append({"plain": plain, "parsed": parsed,
                     "decode": tok.decode(plain, skip_special_tokens=False),
                     "decode_skip": tok.decode(parsed, skip_special_tokens=True)})
    return rows


def main(shared, smollm2, out):
    if not os.path.isdir(f"{shared}/tokenizers"):
        return skip(f"{shared}/tokenizers not found: no tokenizer expectations")
    os.makedirs(out, exist_ok=True)
    texts = corpus()
    json.dump(texts, open(f"{out}/corpus.json", "w"), ensure_ascii=False)
    sources = {n: Tokenizer.from_file(f"{shared}/tokenizers/{n}/tokenizer.json") for n in ("qwen3", "llama3", "llama2")}
    if os.path.exists(smollm2):
        sources["smollm2"] = Tokenizer.from_str(smollm2_tokenizer_json(smollm2))
    else:
        skip(f"default model {smollm2} not found (scripts/fetch_model): no SmolLM2 tokenizer expectations")
    llama2_gguf(f"{shared}/tokenizers/llama2/tokenizer.json", f"{out}/llama2-vocab.gguf")
    for name, tok in sources.items():
        json.dump(expect(tok, texts), open(f"{out}/{name}.expect.json", "w"), ensure_ascii=False)
    print(f"{len(texts)} strings, tokenizers: {', '.join(sources)}")


if __name__ == "__main__":
    main(*sys.argv[1:4])
