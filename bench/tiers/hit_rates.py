#!/usr/bin/env python3
"""Not a test: hit rate per expert tier, prefetch accuracy and bytes copied, for a cluster whose
workers hold only part of the model's experts.

For each hot ratio: starts `strata up` on MODEL with one worker, a memory budget, a placement
plan from the calibration file (the hot set follows its counts) and a fixed hot ratio, scores
the first KB of held-out text through the cluster (`strata eval --server`: prefill windows),
then generates GEN tokens greedily (decode), and reads `strata stats`. Prints a table and
writes JSON.

    python3 bench/tiers/hit_rates.py [--bin build/bin] [--model models/strata-demo]
        [--budget 20MiB] [--ratios 0.2,0.4] [--policy lfu] [--kb 6] [--out FILE.json]
"""
import argparse, json, os, signal, subprocess, sys, tempfile, time

ap = argparse.ArgumentParser()
ap.add_argument('--bin', default='build/bin')
ap.add_argument('--model', default='models/strata-demo')
ap.add_argument('--text', default='tests/data/heldout/strata-demo-valid.txt')
ap.add_argument('--calibration', default='tests/data/heldout/strata-demo-calibration.jsonl')
ap.add_argument('--budget', default='20MiB')
ap.add_argument('--ratios', default='0.2,0.4')
ap.add_argument('--policy', default='lfu')
ap.add_argument('--kb', type=int, default=6)
ap.add_argument('--gen', type=int, default=256)
ap.add_argument('--device', default='cpu')
ap.add_argument('--extra', default='', help='more `strata up` flags')
ap.add_argument('--out', default='')
a = ap.parse_args()
B = a.bin
tmp = tempfile.mkdtemp()
plan = os.path.join(tmp, 'plan.json')
subprocess.run([f'{B}/strata', 'plan', '--model', a.model, '--calibration', a.calibration,
                '--workers', '1', '--out', plan], check=True, stdout=subprocess.DEVNULL)
text = os.path.join(tmp, 'text.txt')
with open(a.text, 'rb') as f, open(text, 'wb') as g:
    g.write(f.read(a.kb * 1024))

rows = []
for ratio in a.ratios.split(','):
    up = subprocess.Popen([f'{B}/strata', 'up', '--model', a.model, '--workers', '1',
                           '--device', a.device, '--plan', plan, '--gpu-memory-budget', a.budget,
                           '--hot-ratio', ratio, '--cache-policy', a.policy] + a.extra.split(),
                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    addr = None
    for line in up.stdout:
        if line.startswith('READY '):
            addr = line.split()[1]
            break
    if addr is None:
        sys.exit(f'strata up did not start (hot ratio {ratio})')
    t0 = time.monotonic()
    ev = json.loads(subprocess.run([f'{B}/strata', 'eval', '--model', a.model, '--text', text,
                                    '--server', addr], check=True, capture_output=True,
                                   text=True).stdout)
    gen = json.loads(subprocess.run([f'{B}/strata', 'generate', '--server', addr, '--prompt',
                                     'And it came to pass', '--max-new-tokens', str(a.gen),
                                     '--ignore-eos'], check=True, capture_output=True,
                                    text=True).stdout)
    seconds = time.monotonic() - t0
    st = json.loads(subprocess.run([f'{B}/strata', 'stats', '--server', addr], check=True,
                                   capture_output=True, text=True).stdout)
    up.send_signal(signal.SIGTERM)
    up.wait()
    t = st['workers'][0]['tiers']
    n = {k: int(v) for k, v in t.items()}
    uses = n['hot_hits'] + n['warm_hits'] + n['misses']
    rows.append({
        'hot_ratio': float(ratio), 'budget': a.budget, 'policy': a.policy,
        'hot_slots': n['hot_slots'], 'warm_slots': n['warm_slots'],
        'slot_mib': round(n['slot_bytes'] / 2**20, 3), 'uses': uses,
        'hot_hit_rate': round(n['hot_hits'] / uses, 4),
        'warm_hit_rate': round(n['warm_hits'] / uses, 4),
        'miss_rate': round(n['misses'] / uses, 4),
        'prefetch_loads': n['prefetch_loads'], 'prefetch_hits': n['prefetch_hits'],
        'prefetch_accuracy': round(int(st['prefetch_correct']) / max(int(st['prefetch_actual']), 1), 4),
        'evictions': n['evictions'], 'mib_copied': round(n['bytes_copied'] / 2**20, 1),
        'scored_tokens': ev['tokens'], 'perplexity': ev['perplexity'],
        'generated_tokens': len(gen['token_ids']),
        'decode_tok_s': gen['usage']['decode_tokens_per_second'], 'seconds': round(seconds, 2)})

cols = ['hot_ratio', 'hot_slots', 'warm_slots', 'hot_hit_rate', 'warm_hit_rate', 'miss_rate',
        'prefetch_accuracy', 'prefetch_hits', 'mib_copied', 'perplexity', 'decode_tok_s']
print(' | '.join(cols))
for r in rows:
    print(' | '.join(str(r[c]) for c in cols))
result = {'model': os.path.basename(os.path.normpath(a.model)), 'device': a.device,
          'date': time.strftime('%Y-%m-%d'), 'command': ' '.join(sys.argv), 'rows': rows}
if a.out:
    with open(a.out, 'w') as f:
        json.dump(result, f, indent=1)
