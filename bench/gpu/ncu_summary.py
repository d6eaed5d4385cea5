#!/usr/bin/env python3
"""Summarizes an Nsight Compute raw CSV (ncu --csv --page raw) of decode_bench: finds the last
decode step (the repeating tail of the launch sequence), prints each kernel's duration and DRAM
bandwidth, and the step's totals.

    python3 bench/gpu/ncu_summary.py ncu.csv [--full]
"""
import csv
import sys


def num(s):
    try:
        return float(s.replace(",", ""))
    except ValueError:
        return 0.0


def main():
    path = sys.argv[1]
    full = "--full" in sys.argv
    with open(path) as f:
        lines = [l for l in f if l.startswith('"')]  # drop the application's own output
    rows = list(csv.reader(lines))
    header, rows = rows[0], rows[2:]  # the second row holds units
    col = {name: i for i, name in enumerate(header)}
    kernels = []
    for r in rows:
        kernels.append({
            "name": r[col["Kernel Name"]][:34],
            "grid": r[col["Grid Size"]],
            "block": r[col["Block Size"]],
            "us": num(r[col["gpu__time_duration.sum"]]) / 1e3,
            "rd": num(r[col["dram__bytes_read.sum"]]),
            "wr": num(r[col["dram__bytes_write.sum"]]),
            "pct": num(r[col["dram__throughput.avg.pct_of_peak_sustained_elapsed"]]),
            "occ": num(r[col["sm__warps_active.avg.pct_of_peak_sustained_active"]]),
            "regs": r[col["launch__registers_per_thread"]],
        })
    names = [k["name"] + k["grid"] for k in kernels]
    step = len(names)
    for d in range(8, len(names) // 2 + 1):
        if names[-d:] == names[-2 * d:-d]:
            step = d
            break
    last = kernels[-step:]
    fmt = "{:>3} {:34} {:>14} {:>9} {:>4} {:>8} {:>8} {:>7} {:>5} {:>5}"
    print(fmt.format("#", "kernel", "grid", "block", "regs", "us", "MB rd", "GB/s", "%dram", "%occ"))
    for i, k in enumerate(last):
        if not full and 24 <= i < len(last) - 4:  # the first layer and the step's tail
            continue
        gbs = (k["rd"] + k["wr"]) / (k["us"] * 1e3) if k["us"] else 0.0
        print(fmt.format(i, k["name"], k["grid"], k["block"], k["regs"], f"{k['us']:.2f}",
                         f"{k['rd'] / 1e6:.2f}", f"{gbs:.0f}", f"{k['pct']:.0f}", f"{k['occ']:.0f}"))
    total_us = sum(k["us"] for k in last)
    total_mb = sum(k["rd"] + k["wr"] for k in last) / 1e6
    print(f"step: {len(last)} kernels, {total_us:.1f} us of kernel time, {total_mb:.1f} MB "
          f"moved, {total_mb / total_us * 1e3:.0f} GB/s over kernel time")
    by = {}
    for k in last:
        e = by.setdefault(k["name"], [0, 0.0, 0.0])
        e[0] += 1
        e[1] += k["us"]
        e[2] += k["rd"] + k["wr"]
    print(f"{'kernel':34} {'n':>4} {'us':>8} {'MB':>8} {'GB/s':>6}")
    for name, (n, us, b) in sorted(by.items(), key=lambda x: -x[1][1]):
        print(f"{name:34} {n:>4} {us:>8.1f} {b / 1e6:>8.1f} {b / us / 1e3 if us else 0:>6.0f}")


if __name__ == "__main__":
    main()
