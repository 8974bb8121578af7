#!/usr/bin/env python3
"""The CUDA issue's table from scripts/gpu_check's bench.log: per shaped model
and type, TTFT at each prompt length (prompt / pp rate, as ../shared/anchors.md
derives llama.cpp's), batch-1 decode (tg128) and the concurrent sequences'
generated tok/s, next to llama.cpp's H100 anchors and the issue's targets.

    python3 scripts/gpu_table.py OUT/bench.log
    python3 scripts/gpu_table.py --bandwidth OUT/gpu_report.md [--peak TB/s]

--bandwidth: for each `wick bench` tg row of a shaped model, the decode step's
share of 3.0 TB/s: every weight byte is read once a token (the head is the
tied embedding), so bytes = parameters x bytes per parameter of the type.
--peak: this GPU's own measured copy (wick_gpu_bench's copy/d2d row; an H200
copies at ~4.3 TB/s), for a column with the share of it.
"""
import re
import sys
from collections import defaultdict

# ../shared/anchors.md, H100, llama.cpp (Feb 2025): pp512, pp1024, pp4096, tg128 tok/s;
# continuous batching: generated tok/s at N sequences (512 in, 128 out).
ANCHORS = {
    ("qwen2.5-0.5b", "bf16"): {"pp512": 54900, "pp1024": 57800, "pp4096": 55700, "tg128": 367,
                               "par": {1: 183, 8: 745, 32: 2085, 64: 2003}},
    ("qwen2.5-0.5b", "q8_0"): {"pp512": 42800, "pp1024": 45400, "tg128": 370},
    ("llama3.2-1b", "bf16"): {"pp512": 43800, "pp1024": 47800, "tg128": 445,
                              "par": {1: 330, 32: 2312}},
    ("llama3.2-1b", "q8_0"): {"pp512": 40500, "pp1024": 42300, "tg128": 514},
}
# The targets, Qwen2.5-0.5B bf16: decode, TTFT at 1,024, 64 sequences.
TARGET_TG, TARGET_TTFT_1024, TARGET_64 = 1100, 12.0, 8000


def parse(lines):
    """{(shape, type): {"pp": {n: tok/s}, "tg": {n: tok/s}, "par": {(seqs, step): row}}}"""
    out = defaultdict(lambda: {"pp": {}, "tg": {}, "par": {}})
    key = None
    for line in lines:
        m = re.match(r"^### (\S+) (\S+)", line)
        if m:
            key = (m.group(1), m.group(2))
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if key is None or len(cells) < 2:
            continue
        test = re.fullmatch(r"(pp|tg)(\d+)", cells[-2])
        if test and len(cells) >= 8:
            out[key][test.group(1)][int(test.group(2))] = float(cells[-1].split("±")[0])
        elif len(cells) == 9 and cells[0].isdigit():  # sequences, prompt, gen, step tokens, ...
            seqs, step = int(cells[0]), int(cells[3])
            out[key]["par"][(seqs, step)] = {"wall": float(cells[5]), "phase": float(cells[6])}
    return out


# bytes per weight of each stored type (blocks of 32 or 256 with their scales)
BYTES_PER_PARAM = {"bf16": 2.0, "f16": 2.0, "f32": 4.0, "q8_0": 34 / 32, "q4_0": 18 / 32,
                   "q4_1": 20 / 32, "q4_k": 144 / 256, "q6_k": 210 / 256}
PEAK_BYTES_PER_S = 3.0e12  # the H100's measured copy (../shared/anchors.md)


def bandwidth(path, peak_tbs=None):
    own = f" | share of this GPU's {peak_tbs:.2f} TB/s" if peak_tbs else ""
    print("| model | tg | tok/s | GB a token | share of 3.0 TB/s" + own + " |")
    print("|---|---|---|---|---|" + ("---|" if peak_tbs else ""))
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cells) < 8 or not cells[0].startswith("shaped:"):
                continue
            test = re.fullmatch(r"tg(\d+)", cells[-2])
            params = re.fullmatch(r"([\d.]+)M", cells[3])
            bpp = BYTES_PER_PARAM.get(cells[0].rsplit(":", 1)[-1])
            if not (test and params and bpp):
                continue
            rate = float(cells[-1].split("±")[0])
            gb = float(params.group(1)) * 1e6 * bpp / 1e9
            print(f"| {cells[0]} | {cells[-2]} | {rate:,.1f} | {gb:.2f} | "
                  f"{100 * rate * gb * 1e9 / PEAK_BYTES_PER_S:.0f} % |"
                  + (f" {100 * rate * gb / 1e3 / peak_tbs:.0f} % |" if peak_tbs else ""))


def mark(ok):
    return "✓" if ok else "✗"


def main():
    if sys.argv[1] == "--bandwidth":
        peak = float(sys.argv[4]) if len(sys.argv) > 4 and sys.argv[3] == "--peak" else None
        return bandwidth(sys.argv[2], peak)
    with open(sys.argv[1], encoding="utf-8", errors="replace") as f:
        data = parse(f)
    print("| model | dtype | TTFT 512 / 1024 / 4096 ms (wick) | llama.cpp | tg128 tok/s (wick / llama.cpp) "
          "| sequences: generated tok/s, wall / generation phase (step tokens) [llama.cpp] |")
    print("|---|---|---|---|---|---|")
    for (shape, dtype), d in data.items():
        a = ANCHORS.get((shape, dtype), {})
        ttft = " / ".join(f"{n / d['pp'][n] * 1e3:.1f}" if n in d["pp"] else "—" for n in (512, 1024, 4096))
        peer = " / ".join(f"{n / a[f'pp{n}'] * 1e3:.1f}" if f"pp{n}" in a else "—" for n in (512, 1024, 4096))
        tg = d["tg"].get(128)
        tg_s = f"{tg:,.0f}" if tg else "—"
        peer_par = a.get("par", {})
        par = "; ".join(f"{s}: {r['wall']:,.0f} / {r['phase']:,.0f} ({step})"
                        + (f" [llama.cpp {peer_par[s]:,}]" if s in peer_par else "")
                        for (s, step), r in sorted(d["par"].items()))
        print(f"| {shape} | {dtype} | {ttft} | {peer} | {tg_s} / {a.get('tg128', '—')} | {par} |")
    q = data.get(("qwen2.5-0.5b", "bf16"))
    if q:
        tg = q["tg"].get(128, 0)
        ttft = 1024 / q["pp"][1024] * 1e3 if 1024 in q["pp"] else float("inf")
        best64, step64 = max(((r["wall"], step) for (s, step), r in q["par"].items() if s == 64),
                             default=(0, 0))
        print()
        print(f"Targets (Qwen2.5-0.5B bf16): batch-1 decode {tg:,.0f} of ≥ {TARGET_TG:,} tok/s "
              f"{mark(tg >= TARGET_TG)}; TTFT at 1,024 {ttft:.1f} of ≤ {TARGET_TTFT_1024} ms "
              f"{mark(ttft <= TARGET_TTFT_1024)}; 64 sequences {best64:,.0f} of ≥ {TARGET_64:,} "
              f"generated tok/s over the wall clock at {step64} tokens a step {mark(best64 >= TARGET_64)}")


if __name__ == "__main__":
    main()
