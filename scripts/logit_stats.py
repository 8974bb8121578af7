#!/usr/bin/env python3
"""scripts/logit_stats.py BASE MODEL... [--text FILE] [--start N] [--tokens N] [--wick BIN]

How models differ from a base model on one window of text, from their full logits (`wick logits
--all`): per model the mean next-token loss on the text (and its perplexity), the mean entropy of
its distributions, the mean KL divergence from the base's, the mean standard deviation of its
logits, and the temperature (0.90-1.10) that brings it closest to the base. Used to ask whether a
quantized file is flatter or sharper than its source (docs/quantize.md). Models are anything
`wick logits` loads; the text is tokenized with BASE's tokenizer. Not run by `make test`.
"""
import argparse
import json
import subprocess

import numpy as np


def log_softmax(x):
    x = x - x.max(1, keepdims=True)
    return x - np.log(np.exp(x).sum(1, keepdims=True))


def logits(wick, model, ids):
    out = subprocess.run([wick, "logits", model, "--ids", ",".join(map(str, ids)), "--all", "--json"],
                         check=True, capture_output=True, text=True).stdout
    return np.array(json.loads(out)["logits"], dtype=np.float64)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[1])
    ap.add_argument("base")
    ap.add_argument("models", nargs="+")
    ap.add_argument("--text", default="/usr/share/common-licenses/GPL-3")
    ap.add_argument("--start", type=int, default=2000)
    ap.add_argument("--tokens", type=int, default=400)
    ap.add_argument("--wick", default="build/bin/wick")
    a = ap.parse_args()
    with open(a.text, "rb") as f:
        text = f.read()
    ids = json.loads(subprocess.run([a.wick, "tokenize", a.base, "-", "--json"], input=text, check=True,
                                    capture_output=True).stdout)[a.start:a.start + a.tokens]
    target = np.array(ids[1:])
    n = len(target)
    lp = log_softmax(logits(a.wick, a.base, ids))[:n]
    p = np.exp(lp)
    print(f"{n} next tokens of {a.text} from token {a.start}")
    print("| model | loss (ppl) | entropy | KLD from base | logit std | closest temperature (its KLD) |")
    print("|---|---|---|---|---|---|")
    for m in [a.base] + a.models:
        z = logits(a.wick, m, ids)[:n]
        lq = log_softmax(z)
        loss = -lq[np.arange(n), target].mean()
        entropy = -(np.exp(lq) * lq).sum(1).mean()
        kld = (p * (lp - lq)).sum(1).mean()
        best = min(((p * (lp - log_softmax(z / t))).sum(1).mean(), t) for t in np.arange(0.90, 1.1001, 0.01))
        print(f"| {m} | {loss:.4f} ({np.exp(loss):.2f}) | {entropy:.4f} | {kld:.4f} | {z.std(1).mean():.4f} "
              f"| {best[1]:.2f} ({best[0]:.4f}) |")


if __name__ == "__main__":
    main()
