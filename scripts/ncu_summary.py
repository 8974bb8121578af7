#!/usr/bin/env python3
"""Per-kernel totals from an ncu --csv --metrics gpu__time_duration.sum run
(scripts/gpu_check stage profile): count, mean and total microseconds, DRAM
bytes as GB/s and as a share of the H100's measured 3.0 TB/s, by kernel name
(template arguments kept, parameters cut) and launch shape, so that the q/k/v,
o, gate/up, down and output-head products of one kernel template stand apart."""
import csv
import sys
from collections import defaultdict

PEAK_GBS = 3000.0  # ../shared/anchors.md: measured copy bandwidth of the H100


def without_params(name):
    """The kernel's name without its trailing parameter list (template arguments kept)."""
    name = name.strip()
    if not name.endswith(")"):
        return name
    depth = 0
    for i in range(len(name) - 1, -1, -1):
        depth += {")": 1, "(": -1}.get(name[i], 0)
        if depth == 0:
            return name[:i]
    return name


rows = defaultdict(lambda: defaultdict(float))
count = defaultdict(set)
with open(sys.argv[1], newline="") as f:
    lines = [l for l in f if l.startswith('"')]
for r in csv.DictReader(lines):
    name = without_params(r["Kernel Name"]).removeprefix("void ")
    name = name.replace("wick::cuda::", "").replace("(anonymous namespace)::", "")[:120]
    if r.get("Grid Size"):
        name += f" grid{r['Grid Size']} block{r.get('Block Size', '?')}"
    try:
        v = float(r["Metric Value"].replace(",", ""))
    except ValueError:
        continue
    rows[name][r["Metric Name"]] += v
    count[name].add(r["ID"])
total = sum(m.get("gpu__time_duration.sum", 0) for m in rows.values())
print(f"{'kernel':110s} {'n':>5s} {'mean us':>9s} {'total us':>10s} {'GB/s':>8s} {'of 3.0TB/s':>10s}")
for name, m in sorted(rows.items(), key=lambda kv: -kv[1].get("gpu__time_duration.sum", 0)):
    t = m.get("gpu__time_duration.sum", 0) / 1e3  # ns -> us
    n = len(count[name])
    b = m.get("dram__bytes_read.sum", 0) + m.get("dram__bytes_write.sum", 0)
    gbs = b / max(t, 1e-9) / 1e3
    print(f"{name:110s} {n:5d} {t / n:9.2f} {t:10.1f} {gbs:8.0f} {100 * gbs / PEAK_GBS:9.0f}%")
print(f"total {total / 1e3:.1f} us")
