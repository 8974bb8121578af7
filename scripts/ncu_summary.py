#!/usr/bin/env python3
"""Per-kernel totals from an ncu --csv --metrics gpu__time_duration.sum run
(scripts/gpu_check stage profile): count, mean and total microseconds, and
DRAM bytes, by kernel name (template arguments kept, parameters cut)."""
import csv
import sys
from collections import defaultdict

rows = defaultdict(lambda: defaultdict(float))
count = defaultdict(set)
with open(sys.argv[1], newline="") as f:
    lines = [l for l in f if l.startswith('"')]
for r in csv.DictReader(lines):
    name = r["Kernel Name"].split("(")[0][:90]
    try:
        v = float(r["Metric Value"].replace(",", ""))
    except ValueError:
        continue
    rows[name][r["Metric Name"]] += v
    count[name].add(r["ID"])
total = sum(m.get("gpu__time_duration.sum", 0) for m in rows.values())
print(f"{'kernel':90s} {'n':>5s} {'mean us':>9s} {'total us':>10s} {'GB/s':>8s}")
for name, m in sorted(rows.items(), key=lambda kv: -kv[1].get("gpu__time_duration.sum", 0)):
    t = m.get("gpu__time_duration.sum", 0) / 1e3  # ns -> us
    n = len(count[name])
    b = m.get("dram__bytes_read.sum", 0) + m.get("dram__bytes_write.sum", 0)
    print(f"{name:90s} {n:5d} {t / n:9.2f} {t:10.1f} {b / max(t, 1e-9) / 1e3:8.0f}")
print(f"total {total / 1e3:.1f} us")
