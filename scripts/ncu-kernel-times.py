#!/usr/bin/env python3
"""Sums `ncu --metrics gpu__time_duration.sum --csv` output per kernel name.

    scripts/ncu-kernel-times.py NCU_CSV [TOP]

Prints the total kernel time, then the TOP (default 30) kernels by summed
time with their launch counts. Used by scripts/gpu-suite.sh on the profile of
one training step.
"""
import collections
import csv
import sys


def main() -> None:
    path = sys.argv[1]
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 30
    with open(path, encoding="utf-8", errors="replace") as f:
        rows = [line for line in f if line.startswith('"')]
    total = collections.defaultdict(float)
    count = collections.Counter()
    unit = "?"
    for r in csv.DictReader(rows):
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        unit = r["Metric Unit"]
        scale = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3}
        us = float(r["Metric Value"].replace(",", "")) * scale.get(unit, float("nan"))
        name = r["Kernel Name"][:80]
        total[name] += us
        count[name] += 1
    all_us = sum(total.values())
    print(f"total kernel time {all_us / 1e3:.2f} ms over {sum(count.values())} launches (ncu unit {unit})")
    for name, us in sorted(total.items(), key=lambda kv: -kv[1])[:top]:
        print(f"{us:10.1f} us {100 * us / all_us:5.1f}% {count[name]:5d}x  {name}")


if __name__ == "__main__":
    main()
