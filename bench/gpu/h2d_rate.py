#!/usr/bin/env python3
"""Host-to-device copy rate of this machine's GPU, from pinned and from pageable memory, for
the copy bound of the expert tiers (bytes copied a token / this rate). Copies of one expert's
size (44 MB: a DeepSeek-V3 FP8 expert; 9 MiB: a qwen3-30b-a3b bf16 expert), back to back on
one stream as the worker's copy stream issues them. Prints a table, writes JSON.

  python3 bench/gpu/h2d_rate.py OUT.json
"""
import json
import sys
import time

import torch


def rate(nbytes, pinned, reps):
    src = torch.empty(nbytes, dtype=torch.uint8, pin_memory=pinned)
    src.fill_(1)
    dst = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        for _ in range(3):
            dst.copy_(src, non_blocking=pinned)
        stream.synchronize()
        start = time.perf_counter()
        for _ in range(reps):
            dst.copy_(src, non_blocking=pinned)
        stream.synchronize()
    seconds = time.perf_counter() - start
    return nbytes * reps / seconds / 1e9


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "h2d_rate.json"
    rows = []
    for label, nbytes in (("dsv3-fp8-expert", 3 * 7168 * 2048), ("qwen3-bf16-expert", 9 << 20)):
        for pinned in (True, False):
            gbps = rate(nbytes, pinned, 100 if pinned else 30)
            rows.append({"copy": label, "bytes": nbytes, "pinned": pinned, "gb_per_s": round(gbps, 2)})
    record = {"device": torch.cuda.get_device_name(0), "rows": rows}
    with open(out, "w") as f:
        json.dump(record, f, indent=1)
    print(f"host-to-device copies on {record['device']}")
    for r in rows:
        kind = "pinned" if r["pinned"] else "pageable"
        print(f"  {r['copy']:<18} {r['bytes'] / 1e6:7.1f} MB {kind:<8} {r['gb_per_s']:6.2f} GB/s")


if __name__ == "__main__":
    main()
