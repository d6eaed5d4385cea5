#!/usr/bin/env python3
"""Turns one peer call's results (bench/gpu/peer_call.sh, stage b: OUT/b.tgz unpacked) into
bench/results records: one "llama.cpp" record per weight type and expert placement
(llama-bench's pp512, pp4096 and tg128 on the checkpoint Strata ran), and Strata's runs of
the same plan as they are, named so docs/performance.md sets them side by side.

    python3 bench/gpu/peer_records.py UNPACKED_B_DIR --commit COMMIT [--date YYYY-MM-DD] [--card h100]
"""
import argparse, datetime, glob, io, json, os, statistics, tarfile

ap = argparse.ArgumentParser()
ap.add_argument('b_dir', help='stage b output, unpacked: llama/ and strata/results.tgz')
ap.add_argument('--commit', required=True, help='the Strata build measured')
ap.add_argument('--date', default=datetime.date.today().isoformat())
ap.add_argument('--card', default='h100', help='suffix of the record names')
ap.add_argument('--results', default='bench/results')
a = ap.parse_args()

llama = os.path.join(a.b_dir, 'llama')
runs = json.load(open(os.path.join(llama, 'summary.json')))
by_key = {}
for r in runs:
    by_key.setdefault((r['type'], r['n_cpu_moe']), {})[r['test']] = r

written = []
for (typ, ncmoe), tests in sorted(by_key.items()):
    any_run = next(iter(tests.values()))
    plan = json.load(open(os.path.join(llama, f'plan-{typ}.json')))
    tg = tests.get('tg128', {})
    samples = tg.get('samples_ts', [])
    placement = 'resident' if ncmoe == 0 else f'ncmoe{ncmoe}'
    record = {
        'model': 'qwen3-30b-a3b-bf16-12L', 'weights': typ, 'mode': 'llama.cpp',
        'concurrency': 1, 'gpus': 1,
        'machine': f"{any_run['gpu_info']} (1 GPU)", 'date': a.date,
        'build': any_run['build'], 'commit': a.commit,
        'command': (f"llama-bench -m model-{typ}.gguf -p 512,4096 -n 128 -ngl 99 -fa 1 "
                    f"-t {any_run['n_threads']} -r 3 -ncmoe {ncmoe} -o json"
                    " (bench/gpu/peer_call.sh, .peer/llama-peer/bench.sh)"),
        'note': (f"experts on the GPU: {any_run['expert_gib_on_gpu']:.2f} GiB of "
                 f"{plan['expert_gib_total']:.2f}" + (f" (-ncmoe {ncmoe}: layers 0-{ncmoe - 1}'s "
                                                      'experts on the CPU)' if ncmoe else '')),
        'n_cpu_moe': ncmoe, 'expert_gib_on_gpu': any_run['expert_gib_on_gpu'],
        'pp512_tok_s': tests.get('pp512', {}).get('tok_s'),
        'pp4096_tok_s': tests.get('pp4096', {}).get('tok_s'),
        'tg128_tok_s': tg.get('tok_s'),
        'decode_tok_s_mean': tg.get('tok_s'),
        'decode_tok_s_p5': min(samples) if samples else tg.get('tok_s'),
        'decode_tok_s_p95': max(samples) if samples else tg.get('tok_s'),
        'input_len': 512, 'output_len': 128,
    }
    name = f"llama.cpp-qwen3-30b-a3b-12L-{typ}-{placement}-{a.card}.json"
    with open(os.path.join(a.results, name), 'w') as f:
        json.dump(record, f, indent=1)
        f.write('\n')
    written.append(name)

# Strata's runs: RUN_NAME like fp8-all-512 / bf16-6g-4096 (the plan's names).
with tarfile.open(os.path.join(a.b_dir, 'strata', 'results.tgz')) as tar:
    for member in tar.getmembers():
        base = os.path.basename(member.name)
        if not member.isfile() or not base.endswith('.json') or base.startswith('stats-'):
            continue
        r = json.load(tar.extractfile(member))
        run = base[:-5]
        parts = run.split('-')
        if parts[0] not in ('fp8', 'bf16') or len(parts) != 3:
            continue  # variants (t128-...) stay in the call's logs
        weights, placement, prompt = parts
        placement = 'resident' if placement == 'all' else f'tiered-{placement}'
        name = (f"strata-qwen3-30b-a3b-12L-{weights}-cluster-in{prompt}-out{r['output_len']}-"
                f"{placement}-{a.card}.json")
        with open(os.path.join(a.results, name), 'w') as f:
            json.dump(r, f, indent=1)
            f.write('\n')
        written.append(name)
print('\n'.join(written))
