#!/usr/bin/env python3
"""Where a kernel's warps stalled, from Nsight Compute's source page as CSV (SASS with the warp stall
sampling per instruction: `ncu -i REPORT --page source --csv --print-source sass`).

Prints the instructions that most samples fell on (address, SASS, samples, its top stall reasons) and
the samples per stall reason over all instructions and over the consumer loop (the SASS between the
first and the last HGMMA/QGMMA that a MUFU.EX2 follows: the mainloop of an attention kernel). Column
names are matched loosely ("Warp Stall Sampling (All Samples)", "stall_long_sb" and the like), as
they change between Nsight Compute versions; with none found it says so and prints the header.

Usage: stall_sites.py SOURCE.csv [--name NAME] [--top 25]
"""
from __future__ import annotations

import argparse
import csv
import re
import sys
from collections import Counter


def number(x: str) -> float:
    try:
        return float((x or "0").replace(",", ""))
    except ValueError:
        return 0.0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("csv")
    ap.add_argument("--name", default="")
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args(argv)
    lines = open(args.csv, errors="replace").read().splitlines()
    head = next((i for i, l in enumerate(lines) if l.startswith('"') and "Source" in l), None)
    if head is None:
        print(f"stall_sites {args.name}: no source table in {args.csv} (first lines: {lines[:3]})")
        return 1
    rows = list(csv.DictReader(lines[head:]))
    cols = list(rows[0].keys()) if rows else []
    total_col = next((c for c in cols if re.search(r"Warp Stall Sampling \(All", c)), None) or \
        next((c for c in cols if "Stall Sampling" in c), None)
    src_col = next((c for c in cols if c.strip().lower() == "source"), None) or next((c for c in cols if "Source" in c), None)
    addr_col = next((c for c in cols if "Address" in c), None)
    reason_cols = [c for c in cols if re.match(r"(stall_|smsp__pcsamp_warps_issue_stalled_)", c.strip())]
    if total_col is None or src_col is None:
        print(f"stall_sites {args.name}: no sampling or source column; columns: {cols}")
        return 1
    all_samples = sum(number(r[total_col]) for r in rows)
    print(f"== {args.name}: {len(rows)} SASS lines, {all_samples:.0f} warp samples ({total_col})")
    for r in sorted(rows, key=lambda r: -number(r[total_col]))[:args.top]:
        reasons = sorted(((number(r[c]), c.strip()) for c in reason_cols if number(r[c]) > 0), reverse=True)[:3]
        print(f"  {r.get(addr_col, '?') if addr_col else '?':>8} {number(r[total_col]):7.0f} "
              f"{100 * number(r[total_col]) / max(all_samples, 1):5.1f}%  {r[src_col].strip()[:70]:70s} "
              + ", ".join(f"{c} {v:.0f}" for v, c in reasons))
    gmma = [i for i, r in enumerate(rows) if re.search(r"\b[HQ]GMMA\b", r[src_col])]
    ex2 = [i for i, r in enumerate(rows) if "MUFU.EX2" in r[src_col]]
    spans = {"all": range(len(rows))}
    if gmma and ex2:
        last = max(ex2)
        first = min((i for i in gmma if i < last), default=None)
        if first is not None:
            spans["consumer loop"] = range(first, last + 1)
    for name, span in spans.items():
        c = Counter()
        for i in span:
            for col in reason_cols:
                c[col.strip()] += number(rows[i][col])
        tot = sum(number(rows[i][total_col]) for i in span)
        print(f"  samples by reason, {name} ({tot:.0f}): " +
              ", ".join(f"{k} {v:.0f}" for k, v in c.most_common(8) if v > 0))
    return 0


if __name__ == "__main__":
    sys.exit(main())
