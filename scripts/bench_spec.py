#!/usr/bin/env python3
"""Speculative decoding: decode speed against plain decoding, same output.

Runs `wick generate --json` (greedy) on one prompt, alternating a plain run
and a speculative run --runs times each (the machine may be shared and
noisy: alternating spreads the noise over both), and reports the median
decode tok/s of each (tokens after the first, over the time after the first
token: the draft model's catch-up on the prompt counts), the speedup, the
acceptance rate and tokens per target forward, and whether every run gave
the same tokens.

  lookup   prompt lookup (--spec ngram) on --model, a prompt that asks it to
           repeat (or lightly edit, --edit) a ~300-token passage
  draft    --target (e.g. the default model converted to f32 with
           `wick convert smollm2.gguf smollm2-f32.gguf --type f32`) with
           --draft (the Q4_1 default model); --prompt-kind copy|essay

Example:
  scripts/bench_spec.py lookup --model ~/.cache/wick/models/smollm2.gguf
  scripts/bench_spec.py draft --target /tmp/smollm2-f32.gguf --draft ~/.cache/wick/models/smollm2.gguf
More `wick generate` flags for the speculative run: --spec-args "--draft-max 4".
"""
import argparse
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys

PASSAGE = (
    "The town of Alder Creek grew up around a mill that was built on the river in the spring of 1852. "
    "For the first twenty years the mill ground wheat and corn for the farms in the valley, and the "
    "miller, a careful man named Thomas Reed, kept a ledger of every sack that passed through his doors. "
    "When the railway reached the valley in 1874, the town changed quickly. A station was built at the "
    "end of Main Street, two hotels opened within a year, and the mill began to ship flour to the cities "
    "in the east. Reed's ledger from those years shows the business growing from a few hundred sacks a "
    "month to several thousand. The success did not last. A fire in the winter of 1889 destroyed the "
    "mill and most of the buildings along the river, and Reed, then an old man, chose not to rebuild. "
    "The town survived because the railway stayed, and by the turn of the century Alder Creek was known "
    "for its orchards rather than its flour. Today the foundations of the old mill can still be seen "
    "from the footbridge, and the ledger is kept in the small museum next to the station, where "
    "visitors can read the neat columns of numbers that recorded the town's first years."
)


def run(wick, model, prompt, max_tokens, extra):
    cmd = [wick, "generate", "--model", model, "--prompt", prompt, "--temperature", "0", "--json",
           "--max-tokens", str(max_tokens), "--ctx-size", "2048", *extra]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=["lookup", "draft"])
    ap.add_argument("--wick", default="build/bin/wick")
    ap.add_argument("--model", default=os.path.expanduser("~/.cache/wick/models/smollm2.gguf"))
    ap.add_argument("--target", help="draft mode: the target model")
    ap.add_argument("--draft", help="draft mode: the draft model")
    ap.add_argument("--edit", action="store_true", help="lookup: ask for a light edit instead of a copy")
    ap.add_argument("--prompt-kind", choices=["copy", "essay"], default="essay")
    ap.add_argument("--max-tokens", type=int, default=320)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--spec-args", default="", help="more wick generate flags for the speculative run")
    a = ap.parse_args()

    copy = "Repeat the following text exactly, word for word:\n\n" + PASSAGE
    edit = ("Rewrite the following text, changing only the name of the miller from Thomas Reed to "
            "William Hart:\n\n" + PASSAGE)
    essay = "Write a detailed essay about the history of bread, from ancient Egypt to modern bakeries."
    if a.mode == "lookup":
        model, prompt, spec = a.model, edit if a.edit else copy, ["--spec", "ngram"]
    else:
        if not a.target or not a.draft:
            sys.exit("draft mode needs --target and --draft")
        model, prompt, spec = a.target, copy if a.prompt_kind == "copy" else essay, ["--draft", a.draft]
    spec += shlex.split(a.spec_args)

    plain_runs, spec_runs = [], []
    for i in range(a.runs):
        plain_runs.append(run(a.wick, model, prompt, a.max_tokens, []))
        spec_runs.append(run(a.wick, model, prompt, a.max_tokens, spec))
        print(f"run {i + 1}: plain {plain_runs[-1]['decode_tok_s']:.1f} tok/s, "
              f"speculative {spec_runs[-1]['decode_tok_s']:.1f} tok/s", file=sys.stderr)
    same = all(r["tokens"] == plain_runs[0]["tokens"] for r in plain_runs + spec_runs)
    p = statistics.median(r["decode_tok_s"] for r in plain_runs)
    s = statistics.median(r["decode_tok_s"] for r in spec_runs)
    last = spec_runs[-1]
    print(json.dumps({
        "mode": a.mode, "model": model, "spec_flags": " ".join(spec), "cpu": cpu_name(),
        "prompt_tokens": last["prompt_tokens"], "generated_tokens": last["generated_tokens"],
        "plain_decode_tok_s": round(p, 1), "spec_decode_tok_s": round(s, 1), "speedup": round(s / p, 2),
        "acceptance_rate": round(last["acceptance_rate"], 3),
        "tokens_per_forward": round(last["tokens_per_forward"], 2),
        "same_tokens": same, "runs": a.runs,
        "plain_all": [round(r["decode_tok_s"], 1) for r in plain_runs],
        "spec_all": [round(r["decode_tok_s"], 1) for r in spec_runs],
    }, indent=1))
    if not same:
        sys.exit("the speculative runs gave other tokens than plain decoding")


if __name__ == "__main__":
    main()
