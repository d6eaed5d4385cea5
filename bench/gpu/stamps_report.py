#!/usr/bin/env python3
"""Where a replayed decode step's time goes across the router and a worker on one GPU.

Reads the GPU clock stamps that strata-router and strata-worker append when started with
STRATA_GPU_CLOCK_STAMPS=DIR (DIR/router.txt, DIR/worker-0.txt; see gpu::ClockStamps) and
prints the median microseconds of each phase of a MoE layer and of the gap between steps:
  router   the router's own work between two layers' hand-overs (combine, attention, gate)
  send     input copy, routing split and raising the input flag
  to-w     until the worker's stream has seen the flag
  experts  the worker's expert kernels
  to-r     from the worker's experts until the router's stream has seen the output flag
  step gap last layer's hand-over to the next step's first (lm_head, sampling on the host,
           the next step's messages and launches, the first layer's attention)
Each stamp is itself a small kernel on the path: phases read a microsecond or two high.
  python3 bench/gpu/stamps_report.py DIR [--json OUT]
"""
import bisect
import json
import statistics
import sys


def read(path):
    steps = []
    with open(path) as f:
        for line in f:
            if line.startswith('#') or not line.strip():
                continue
            fields = line.split()
            stamps = {}
            for item in fields[1:]:
                slot, ns = item.split(':')
                stamps[int(slot)] = int(ns)
            steps.append(stamps)
    return steps


def main():
    d = sys.argv[1]
    router = read(f'{d}/router.txt')
    worker = read(f'{d}/worker-0.txt')
    # Replayed steps stamp all three slots of each MoE layer.
    full = [s for s in router if s and all((k // 3 * 3) in s and (k // 3 * 3 + 2) in s for k in s)]
    if not full:
        sys.exit('no replayed steps in router.txt')
    layers = sorted({k // 3 for k in full[0]})
    full = [s for s in full if sorted({k // 3 for k in s}) == layers]
    w_by_start = sorted((s[2 * layers[0]], s) for s in worker if 2 * layers[0] in s)
    w_starts = [t for t, _ in w_by_start]
    phases = {p: [] for p in ('router', 'send', 'to-w', 'experts', 'to-r', 'layer')}
    first_to_w, gaps, step_us = [], [], []
    for i, r in enumerate(full):
        lo, hi = r[3 * layers[0] + 1], r[3 * layers[0] + 2]
        j = bisect.bisect_left(w_starts, lo)
        if j >= len(w_starts) or w_starts[j] > hi:
            continue
        w = w_by_start[j][1]
        if any(2 * l not in w or 2 * l + 1 not in w for l in layers):
            continue
        first_to_w.append((w[2 * layers[0]] - r[3 * layers[0] + 1]) / 1e3)
        for n, l in enumerate(layers):
            if n > 0:
                phases['router'].append((r[3 * l] - r[3 * layers[n - 1] + 2]) / 1e3)
            phases['send'].append((r[3 * l + 1] - r[3 * l]) / 1e3)
            if n > 0:
                phases['to-w'].append((w[2 * l] - r[3 * l + 1]) / 1e3)
            phases['experts'].append((w[2 * l + 1] - w[2 * l]) / 1e3)
            phases['to-r'].append((r[3 * l + 2] - w[2 * l + 1]) / 1e3)
            phases['layer'].append((r[3 * l + 2] - (r[3 * layers[n - 1] + 2] if n else r[3 * l])) / 1e3)
        if i + 1 < len(full):
            gap = (full[i + 1][3 * layers[0]] - r[3 * layers[-1] + 2]) / 1e3
            if gap < 20000:  # consecutive steps of one request, not the pause between requests
                gaps.append(gap)
                step_us.append((full[i + 1][3 * layers[0]] - r[3 * layers[0]]) / 1e3)
    if not first_to_w:
        sys.exit('no router step paired with a worker step (worker-0.txt empty or out of range)')
    med = {p: statistics.median(v) for p, v in phases.items() if v}
    med['first layer to-w'] = statistics.median(first_to_w)
    med['step gap'] = statistics.median(gaps) if gaps else float('nan')
    med['step'] = statistics.median(step_us) if step_us else float('nan')
    print(f'{len(first_to_w)} replayed steps matched ({len(full)} router, {len(worker)} worker), '
          f'{len(layers)} MoE layers; median us:')
    for p, v in med.items():
        print(f'  {p:18s} {v:9.1f}')
    if '--json' in sys.argv:
        with open(sys.argv[sys.argv.index('--json') + 1], 'w') as f:
            json.dump({'steps': len(first_to_w), 'moe_layers': len(layers), 'median_us': med}, f,
                      indent=1)


if __name__ == '__main__':
    main()
