#!/usr/bin/env python3
"""Encode speed of HF `tokenizers` (Rust core, one thread) on the corpus that
bench/bench_tokenizer.cpp uses: one string at a time, as wick encodes.
usage: bench_tokenizers.py SHARED_DIR CORPUS_JSON"""
import json
import os
import sys
import time

os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"
from tokenizers import Tokenizer  # noqa: E402

shared, corpus = sys.argv[1], json.load(open(sys.argv[2]))
n_bytes = sum(len(s.encode()) for s in corpus)
for name in ("qwen3", "llama3", "llama2"):
    tok = Tokenizer.from_file(f"{shared}/tokenizers/{name}/tokenizer.json")
    tok.encode_special_tokens = True
    for s in corpus[:200]:
        tok.encode(s, add_special_tokens=False)  # warm-up
    best = 1e9
    for _ in range(5):
        t0 = time.perf_counter()
        for s in corpus:
            tok.encode(s, add_special_tokens=False)
        best = min(best, time.perf_counter() - t0)
    whole = "\n".join(corpus)
    best_whole = 1e9
    for _ in range(5):
        t0 = time.perf_counter()
        tok.encode(whole, add_special_tokens=False)
        best_whole = min(best_whole, time.perf_counter() - t0)
    print(f"tokenizers {name:7s} per string {n_bytes / best / 1e6:6.2f} MB/s   whole corpus as one text {len(whole.encode()) / best_whole / 1e6:6.2f} MB/s")
