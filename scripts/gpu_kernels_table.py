#!/usr/bin/env python3
"""scripts/gpu_kernels_table.py KERNELS.json [--peak TB/s]: wick_gpu_bench's JSON as one
markdown table, a row per model, weight type and product:

  MB        one copy of the product's weights on the device (scales included)
  rule      kw_for's slice count at one row, back to back: us a product and
            its share of 3.0 TB/s (the H100's copy); where the JSON has the
            copy/d2d row of another GPU (an H200 copies at ~4.3 TB/s), also
            the share of that GPU's own copy after a slash
  kw4..32   the share at each forced slice count (the best one starred)
  t1, t2, t4 the share at 1, 2 or 4 forced 8-row tiles a warp (the rule's count
            of slices; the best one starred)
  +norm     the share at the rule when each product follows a one-row rmsnorm
            (a decode step's order; the norm's time counted)
  M16       the share at 16 rows (a batched decode step)
  M512      TFLOP/s at 512 rows (prefill), and (bf16) at 4 / 8 forced slices;
            8/4-bit weights: "pd0" after it, the tiled kernel's warps each
            decoding their own tiles' weights (WICK_CUDA_PREDECODE=0)
  int       8/4-bit weights with integer products (WICK_CUDA_INT_MMA): the
            share at the rule, after a norm (one row: dp4a, WICK_CUDA_INT_DP4A),
            at 16 rows; TFLOP/s at 512 rows
  int kw    the integer products' share at 8 / 16 / 32 forced slices (the best
            one starred), and at two 8-row tiles a warp (t2; not gate/up)
  imma      the integer products' one-row cells on the tensor cores' mma
            (WICK_CUDA_INT_DP4A=0): the share at the rule, after a norm
  xs0       x not staged in shared memory (WICK_CUDA_X_STAGE=0; the rule, the
            other cells staged where it fits): the share at one row, after a
            norm, at 16 rows
"""
import json
import re
import sys
from collections import defaultdict

NAME = re.compile(r"^mm/([^/]+)/([^/]+)/([^/]+)/M(\d+)/kw(\d+)/t(\d+)/(b2b|norm|intb2b|intnorm|immab2b|immanorm|xs0b2b|xs0norm|pd0b2b)")


def load(path):
    """The JSON, or what a run cut short (a timeout) had written: its
    benchmark entries are flat objects, so closing the list after the last
    whole one recovers them."""
    text = open(path).read()
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        pass
    end = len(text)
    while (end := text.rfind("}", 0, end)) > 0:
        try:
            data = json.loads(text[: end + 1] + "]}")
            print(f"note: {path} was cut short; {len(data.get('benchmarks', []))} rows kept")
            return data
        except json.JSONDecodeError:
            continue
    return {}


def copy_tbs(data):
    """This GPU's measured copy (TB/s, read + written), or None."""
    for b in data.get("benchmarks", []):
        if b.get("name", "").startswith("copy/d2d/") and not b.get("error_occurred"):
            return b.get("TB/s")
    return None


def main(path, peak=None):
    data = load(path)
    peak = copy_tbs(data) or peak
    # another GPU than the H100 (beyond 5 %): shares of its own copy too
    own = peak / 3.0 if peak and abs(peak / 3.0 - 1) > 0.05 else None
    if peak:
        print(f"This GPU copies at {peak:.2f} TB/s (read + written; the H100's: 3.0)."
              + (f" Rule cells: share of 3.0 TB/s / of {peak:.2f}." if own else ""))
        print()
    rows = defaultdict(dict)
    order = []
    for b in data.get("benchmarks", []):
        m = NAME.match(b.get("name", ""))
        if not m or b.get("error_occurred"):
            if m:
                print(f"error: {b['name']}: {b.get('error_message', '?')}")
            continue
        model, dtype, proj, M, kw, tiles, chain = m.groups()
        key = (model, dtype, proj)
        if key not in rows:
            order.append(key)
        rows[key][(int(M), int(kw), int(tiles), chain)] = b
    kws, nts = [4, 8, 16, 32], [1, 2, 4]
    print("| model | type | product | MB | rule: us, share | "
          + " | ".join(f"kw{k}" for k in kws) + " | " + " | ".join(f"t{t}" for t in nts)
          + " | +norm | M16 | M512 TFLOP/s | int: rule, +norm, M16, M512 | int kw8 / 16 / 32, t2"
          + " | imma: rule, +norm | xs0: rule, +norm, M16 |")
    print("|---|---|---|---|---|" + "---|" * (len(kws) + len(nts)) + "---|---|---|---|---|---|---|")
    def share(b):
        return f"{100 * b['of_3TB/s']:.0f} %" if b else "-"
    for key in order:
        r = rows[key]
        rule = r.get((1, 0, 0, "b2b"))

        def starred(runs):
            best = max((k for k in runs if runs[k]), key=lambda k: runs[k]["of_3TB/s"], default=None)
            return [f"{share(runs[k])}{'*' if k == best else ''}" for k in runs]

        cells = starred({k: r.get((1, k, 0, "b2b")) for k in kws})
        cells += starred({t: r.get((1, 0, t, "b2b")) for t in nts})
        mb = f"{(rule or next(iter(r.values())))['MB']:.1f}"
        rule_cell = f"{rule['us']:.1f}, {share(rule)}" if rule else "-"
        if rule and own:
            rule_cell += f" / {100 * rule['of_3TB/s'] / own:.0f} %"
        m512 = r.get((512, 0, 0, "b2b"))
        print(f"| {key[0]} | {key[1]} | {key[2]} | {mb} | {rule_cell} | " + " | ".join(cells)
              + f" | {share(r.get((1, 0, 0, 'norm')))} | {share(r.get((16, 0, 0, 'b2b')))} | "
              + (f"{m512['TFLOP/s']:.0f}" if m512 else "-")
              + "".join(f" / {b['TFLOP/s']:.0f}" for b in (r.get((512, k, 0, "b2b")) for k in (4, 8)) if b)
              + (f", pd0 {r[(512, 0, 0, 'pd0b2b')]['TFLOP/s']:.0f}" if (512, 0, 0, "pd0b2b") in r else "")
              + " | " + int_cell(r, own) + " | "
              + " / ".join(starred({k: r.get((1, k, 0, "intb2b")) for k in (8, 16, 32)}))
              + f", {share(r.get((1, 0, 2, 'intb2b')))} | "
              + ", ".join(share(r.get(k)) for k in ((1, 0, 0, "immab2b"), (1, 0, 0, "immanorm")))
              + " | " + ", ".join(share(r.get(k)) for k in ((1, 0, 0, "xs0b2b"), (1, 0, 0, "xs0norm"),
                                                    (16, 0, 0, "xs0b2b"))) + " |")


def int_cell(r, own=None):
    """The integer products' cells (8/4-bit weights), or '-'; own: the rule's
    share of this GPU's copy too."""
    got = [r.get((1, 0, 0, "intb2b")), r.get((1, 0, 0, "intnorm")), r.get((16, 0, 0, "intb2b"))]
    m512 = r.get((512, 0, 0, "intb2b"))
    if not any(got) and not m512:
        return "-"
    shares = ", ".join(f"{100 * b['of_3TB/s']:.0f} %" if b else "-" for b in got)
    if got[0] and own:
        shares = shares.replace(" %", f" % / {100 * got[0]['of_3TB/s'] / own:.0f} %", 1)
    return shares + ", " + (f"{m512['TFLOP/s']:.0f}" if m512 else "-")


if __name__ == "__main__":
    # [--peak TB/s]: the copy measured in another run (gpu_check's copy.json)
    main(sys.argv[1], float(sys.argv[3]) if len(sys.argv) > 3 and sys.argv[2] == "--peak" else None)
