#!/usr/bin/env python3
"""Compares the verdicts of two falsification.csv files trial by trial.

    scripts/compare-verdicts.py FIRST.csv SECOND.csv

Prints one line: "same verdicts on N trials", or the trials whose status
differs (or that only one file has). Exits 1 when they differ.
"""
import csv
import sys


def verdicts(path):
    with open(path, newline="", encoding="utf-8") as f:
        return {(r["contract"], r["test_id"]): r["status"] for r in csv.DictReader(f)}


def main() -> int:
    first, second = verdicts(sys.argv[1]), verdicts(sys.argv[2])
    differ = sorted(
        f"{c}::{t} {first.get((c, t), 'absent')} -> {second.get((c, t), 'absent')}"
        for (c, t) in first.keys() | second.keys()
        if first.get((c, t)) != second.get((c, t))
    )
    if differ:
        print(f"{len(differ)} verdicts differ: " + "; ".join(differ))
        return 1
    print(f"same verdicts on {len(first)} trials")
    return 0


if __name__ == "__main__":
    sys.exit(main())
