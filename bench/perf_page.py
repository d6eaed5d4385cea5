#!/usr/bin/env python3
"""Writes docs/performance.md from bench/results/*.json: one row per measured configuration
(model x weights x mode x tiers x concurrency), each with its commit, date, machine and the
exact command. Older records live in bench/archive/results/ and are not shown.

    python3 bench/perf_page.py [--out docs/performance.md]
"""
import argparse, glob, json, os, re, subprocess

ap = argparse.ArgumentParser()
ap.add_argument('--results', default='bench/results')
ap.add_argument('--out', default='docs/performance.md')
a = ap.parse_args()


def added_in(path):
    """The commit that added a record without a "commit" field (it was measured on its parent
    or earlier)."""
    out = subprocess.run(['git', 'log', '--diff-filter=A', '--follow', '--format=%h', '--', path],
                         capture_output=True, text=True).stdout.split()
    return f'recorded in {out[-1]}' if out else 'uncommitted'


def config(name, r):
    """What ran, in words, from the file name and the note."""
    words = []
    if 'netns-grpc' in name:
        words.append('**workers in another network namespace (veth), gRPC transport'
                     + (', FP8 activations**' if 'netns-grpc-fp8' in name else '**'))
    if 'zipf1' in name:
        words.append('Zipf(1.0) routing skew')
    if 'tiered-24g' in name:
        words.append('**24 GiB expert budget**')
    elif 'tiered-1g' in name:
        words.append('**1 GiB expert budget** (19 slots for 2 MoE layers, the 10 a MoE layer the whole '
                     'model gets under 24 GiB), 2-token steps')
    elif 'tiered-7.4g' in name:
        words.append('**7.4 GiB expert budget per worker** (24 GiB scaled to 8 of 26 layers)')
    elif 'resident' in name:
        words.append('every expert resident')
    if 'sampled' in name or r.get('temperature', 0) > 0:
        knobs = [f"T={r.get('temperature') or 1:g}"]
        if r.get('top_k'):
            knobs.append(f"top_k {r['top_k']}")
        if r.get('top_p', 1) < 1:
            knobs.append(f"top_p {r['top_p']:.2g}")
        if r.get('repetition_penalty', 1) != 1:
            knobs.append(f"repetition_penalty {r['repetition_penalty']:.2g}")
        words.append(f"sampled ({', '.join(knobs)})")
        if '-device-sampling-' in name:
            words.append('picked on the device, steps launched ahead')
        if '-device-sampling-radix-' in name:
            words.append('one block a row, radix passes (0fefb73)')
        if '-device-sampling-cut-' in name:
            words.append('a row\'s cut on a cluster of 8 blocks (row_cut.cuh)')
    elif 'zipf1' in name:
        words.append('greedy')
    if 'prefix-cache-' in name:
        words.append(f"{r['input_len']:,}-token prompts sharing their first {r.get('shared_prefix', 0):,}, "
                     f"**prefix cache {'on' if 'prefix-cache-on' in name else 'off'}**")
    if '-context-' in name:
        shared = f" sharing their first {r['shared_prefix']:,} (cached)" if r.get('shared_prefix') else ''
        words.append(f"{r['input_len']:,}-token prompts{shared}, {r['output_len']} generated")
        if name.endswith('-eager.json'):
            words.append('decode graphs off')
    if '-text-prompts' in name:
        words.append('held-out text prompts (--prompts), up to 128 tokens, 128 generated')
    if '-speculation-' in name and '-text-prompts' not in name:
        words.append('128-token random prompts, 256 generated (the random model repeats one token)')
    if '-speculation-off' in name:
        words.append('no speculation')
    elif '-speculation-' in name:
        acc = r.get('draft_acceptance')
        kind = 'draft-model' if '-speculation-draft-' in name else 'prompt-lookup'
        words.append(f'**{kind} speculation, up to 4 tokens**' +
                     (f' (acceptance {acc:.0%})' if acc is not None else ''))
    if '-kv1g-shared' in name:
        words.append('**1 GiB KV pool at start, grown into the slots the worker lends** '
                     '(`--kv-cache-share-expert-memory`; without it the 16k prompt is refused)')
    elif name.endswith('-128-shared.json'):
        words.append('shared KV/expert budget (nothing lent at 128 tokens)')
    elif '-kv8g' in name:
        words.append('8 GiB KV pool')
    if name.endswith('-no-predict.json'):
        words.append('next-layer prediction off (`--prefetch=false`)')
    elif name.endswith('-predict.json'):
        words.append('next-layer prediction on the device (eager steps; accuracy in the stats)')
    if '-cold-cpu' in name:
        words.append("**cold experts on strata-expert-store's CPUs** (`--cold-experts cpu`, eager steps)")
    elif '-cold-split' in name:
        words.append('**cold experts shared between copies and the CPUs** '
                     '(`--cold-experts split`, eager steps)')
    elif '-cold-in-place' in name:
        words.append('cold experts read in place (decode graphs)')
    elif '-cold-auto' in name:
        words.append('cold experts `auto`: decode graphs reading them in place, or eager steps '
                     'sharing them between copies and the CPUs where timed faster'
                     + (' (eager chosen)' if r.get('eager_steps_preferred') else ''))
    if '-kv-fp8' in name:
        words.append('**FP8 keys and values** (calibrated on the warm-up request)')
    elif '-kv-bf16' in name:
        words.append('bf16 keys and values')
    if name.endswith('-before.json'):
        words.append('build before the redesign')
    if name.endswith('-before-groups.json'):
        words.append('build before the decode attention split long contexts over clusters')
    cut = re.search(r'-(\d+)L-', name)
    depth = {'seed-125b': 26, 'deepseek-v3': 61, 'kimi-k2': 61}
    model = next((m for m in depth if name.startswith(f'strata-{m}-')), None)
    if cut and model:
        words.append(f'{cut.group(1)} of {depth[model]} layers')
    if '2gpu' in name:
        words.append('2 GPUs')
    if '-2w-' in name:
        words.append('2 workers on 1 GPU')
    if r.get('machine') and 'H200' not in r['machine']:
        words.append(f"**on {r['machine'].split(' (')[0]}**")
    if r.get('output_len', 512) != 512 and not any('generated' in w for w in words):
        words.append(f"{r['output_len']} generated")
    return ', '.join(words)


def tiers(r):
    """Expert uses by tier and bytes copied a token, where `strata bench` recorded them."""
    t = r.get('tiers')
    if not t:
        return ''
    cpu = t.get('cpu_tier_experts_per_token', 0)
    return (f"{t['hot_hit_rate']:.0%} / {t['warm_hit_rate']:.0%} / {t['miss_rate']:.0%}, "
            f"{t['bytes_copied_per_token'] / 1e6:.0f} MB" + (f", {cpu:.1f} on CPU" if cpu else ''))


rows, prefill, peer = [], [], []
for path in sorted(glob.glob(os.path.join(a.results, '*.json'))):
    r = json.load(open(path))
    if 'decode_tok_s_mean' not in r:
        continue
    name = os.path.basename(path)
    if '-prefill-' in name:  # long prompts: their own table
        prefill.append((name, r))
        continue
    if '-12L-' in name:  # beside llama.cpp: their own table
        peer.append((name, r))
        continue
    rows.append({
        'file': name, 'model': r['model'].split('-zipf')[0].replace('-fp8', '').replace('-bf16', ''),
        'weights': r['weights'], 'mode': r['mode'], 'c': r.get('concurrency', 1),
        'decode': r['decode_tok_s_mean'], 'p5': r['decode_tok_s_p5'], 'p95': r['decode_tok_s_p95'],
        'ttft': r.get('ttft_ms', 0), 'tput': r.get('throughput_tok_s'),
        'date': r.get('date', ''), 'machine': r.get('machine', ''),
        'commit': r.get('commit') or added_in(path), 'command': r.get('command', ''),
        'config': config(name, r), 'tiers': tiers(r)})
order = {'cluster': 0, 'in-process': 1, 'transformers': 2}
rows.sort(key=lambda x: (x['model'], x['weights'], order.get(x['mode'], 3), x['config'], x['c']))

lines = [
    '# Performance',
    '',
    'What the code does now, as measured: one row per configuration, from the records in',
    '`bench/results/` (regenerate this page with `python3 bench/perf_page.py`). Decode tok/s is per',
    'request (mean, P5-P95 over the runs), throughput is all requests\' tokens per second of a',
    'round; 128 prompt tokens and 512 generated unless the command says otherwise; batch 1 unless',
    '`c` says. "Commit" is the build measured, or the commit that recorded an older figure. Under',
    'expert tiers, the record\'s share of expert uses that were hot, warm and cold, and the bytes',
    'copied (and experts computed on the CPU tier) per generated token, where `strata bench` recorded them.',
    'Earlier figures, and how each was reached: `docs/archive/`, `bench/archive/results/`. Rooflines',
    'on the H200 (4.3 TB/s): qwen3-30b-a3b about 700 tok/s bf16, 1290 FP8; mixtral-8x7b 168 / 333.',
    '',
    '| model | weights | mode | configuration | c | decode tok/s | throughput | TTFT ms | expert uses hot / warm / cold, copied a token | date | commit | # |',
    '|---|---|---|---|---|---|---|---|---|---|---|---|',
]
for i, r in enumerate(rows, 1):
    tput = f"{r['tput']:.1f}" if r['tput'] else ''
    lines.append(f"| {r['model']} | {r['weights']} | {r['mode']} | {r['config']} | {r['c']} | "
                 f"**{r['decode']:.1f}** ({r['p5']:.1f}-{r['p95']:.1f}) | {tput} | "
                 f"{r['ttft']:.1f} | {r['tiers']} | {r['date']} | {r['commit']} | {i} |")
lines += ['',
          '**Reading the tier rows.** The Zipf(1.0) models are random weights whose gates favour',
          'experts by a Zipf law (`strata make-model --skew zipf:1.0`; its sidecar gives the',
          'selection probabilities; Gini 0.55 over a layer\'s experts, against 0.35 for the trained',
          'demo model\'s routing on held-out text, bench/profiles/routing-strata-demo-heldout-hit-rates.json).',
          'Their decode steps route almost alike, greedy or sampled: over the measured runs under a',
          '24 GiB budget 0.0% (FP8) and 0.2% (bf16) of expert uses were cold (bench/profiles/tiers-*),',
          'where independent draws from the designed distribution would make 3% and 19% cold. These',
          'rows therefore measure the tiered machinery (tables, counting, graphs) at near-full hit',
          'rates, not the cost of misses.', '',
          '**Sampled decoding.** The kernels before the one measured here (records in',
          'bench/archive/results/): the rows "picked on the device" (build 28d6ad3, H100) drew their',
          'tokens inside the replayed decode step, penalties too, with steps launched ahead: T 0.7 and',
          'top_p 0.9 decoded at 96% of greedy at batch 1 (334.7 against 349.1 tok/s) and 93% with 8',
          'requests (118.4 against 127.6). The kernel of 0fefb73 (any top-k and nucleus size, the host',
          'Sampler\'s draws exactly) made them slower, measured on build fe4dcbe ("radix" rows): 65% of',
          'greedy at batch 1 (225.0 against 348.7) and 83% with 8 requests (105.2 against 127.3). This',
          'random model\'s rows are nearly flat, so a top_p 0.9 nucleus holds most of the vocabulary,',
          'and one block a row took about 1.6 ms more a step than greedy (its radix passes on one SM,',
          'all threads adding into one histogram). Its successor ("cut" rows, build ef7ff0f\'s kernels,',
          'H100) finds a row\'s cut on a cluster of 8 blocks (a band of ranked tokens for peaked rows,',
          'radix passes whose per-group histograms meet in block 0 for flat ones) and draws over the',
          'row on many blocks: T 0.7 / top_p 0.9 at 94% of greedy at batch 1 (326.9 against 348.2',
          'tok/s), 94% with repetition_penalty 1.1, 95% with top_k 50, T 1 alone at 99.8%; with 8',
          'requests 97% (120.5 against 124.6) and 97% with the penalty. Greedy is where it was (348.7',
          'on fe4dcbe).',
          '']
# Records whose median TTFT includes a prefix-cache hit (bench/profiles/prefill-h100/README.md):
# their other request (P95 of two) is the whole prefill.
# A clean record in bench/results of the same weights, prompt and setting supersedes them.
def prefill_setting(name, r):
    return (r['weights'], r['input_len'], '-24g' in name,
            name.endswith('-before.json') or r.get('commit') == 'b937886')


clean = {prefill_setting(n, r) for n, r in prefill}
uncached = []
for path in sorted(glob.glob('bench/profiles/prefill-*/*.json')):
    r = dict(json.load(open(path)))
    if r.get('server_prefix_cache_hit_tokens') == 0:  # not the median-is-a-hit case
        continue
    if prefill_setting(os.path.basename(path), r) in clean:
        continue
    if r.get('requests') == 2 and 'ttft_ms_p95' in r and r['input_len'] >= 4096:
        flop = r['prefill_tflops'] * r['ttft_ms'] if r.get('prefill_tflops') else 0
        r['ttft_ms'] = r['ttft_ms_p95']
        r['prefill_tok_s'] = r['input_len'] / (r['ttft_ms'] / 1e3)
        r['prefill_tflops'] = flop / r['ttft_ms'] if flop else 0
        r['prefill_peak_share'] = (r['prefill_tflops'] / r['peak_tflops']
                                   if flop and r.get('peak_tflops') else 0)
        r['uncached'] = os.path.dirname(path)
        uncached.append((os.path.basename(path), r))
prefill += uncached
if prefill:
    lines += ['## Long prompts', '',
              'Time to first token of one long prompt (batch 1, cut into steps of `--max-batch-tokens`',
              '4096), the median of the measured requests, none of them in the prefix cache; the',
              'prompt\'s FLOPs (every token through q/k/v/o, the gate and its routed experts, plus',
              'causal attention; `ModelInfo`) over that time, and their share of the dense bf16',
              'tensor-core peak of the card (989 TFLOP/s on the H100 and H200 SXM, NVIDIA\'s',
              'datasheet figure; FP8 experts still multiply in bf16 here). "before" is the build',
              'before the tensor-core prefill kernels. Decode rows: inter-token latency of 8 requests',
              'while a 16k prompt is prefilled beside them (`--interfering-prompt-len`).', '',
              '| model | weights | configuration | prompt | TTFT ms | prefill tok/s | TFLOP/s | of peak | commit | machine |',
              '|---|---|---|---|---|---|---|---|---|---|']
    for name, r in sorted(prefill, key=lambda x: (x[1]['weights'], 'itl' in x[0], x[1]['input_len'], x[0])):
        if r.get('interfering_prompt_len'):
            continue
        flops = f"{r['prefill_tflops']:.0f}" if r.get('prefill_tflops') else ''
        share = f"{r['prefill_peak_share']:.0%}" if r.get('prefill_peak_share') else ''
        before = name.endswith('-before.json') or r.get('commit') == 'b937886'
        setting = ('**24 GiB expert budget**' if '-24g' in name else 'every expert resident') + \
            (', before' if before else '') + (f" ({r['uncached']}†)" if r.get('uncached') else '')
        lines.append(f"| {r['model'].split('-zipf')[0]} | {r['weights']} | {setting} | {r['input_len']:,} | "
                     f"**{r['ttft_ms']:.0f}** | {r['prefill_tok_s']:,.0f} | {flops} | {share} | "
                     f"{r.get('commit', '')} | {r.get('machine', '').split(' (')[0]} |")
    if uncached:
        lines += ['', '†: the one request of two that was not a prefix-cache hit (`ttft_ms_p95`); the',
                  'folder\'s README says why the median was not a prefill.']
    itl = [(n, r) for n, r in prefill if r.get('interfering_prompt_len')]
    if itl:
        lines += ['', '| model | weights | requests decoding | ITL P50 ms | P95 | P99 | max | beside a prompt of | its TTFT ms | gaps during its prefill: P95 ms | max | commit |',
                  '|---|---|---|---|---|---|---|---|---|---|---|---|']
        for n, r in itl:
            lines.append(f"| {r['model'].split('-zipf')[0]} | {r['weights']} | {r['concurrency']} | "
                         f"{r['itl_ms_p50']:.1f} | {r['itl_ms_p95']:.1f} | {r['itl_ms_p99']:.1f} | "
                         f"{r['itl_ms_max']:.1f} | {r['interfering_prompt_len']:,} | "
                         f"{r['interfering_ttft_ms']:.0f} | **{r['interfered_itl_ms_p95']:.1f}** | "
                         f"{r['interfered_itl_ms_max']:.1f} | {r.get('commit', '')} |")
    kernels = sorted(glob.glob('bench/profiles/prefill-kernels-*.json'))
    for path in kernels:
        k = json.load(open(path))
        lines += ['', f"The kernels alone on the {k['device']} (`{k.get('command', 'prefill_kernel_bench')}`; "
                  'qwen3-30b-a3b\'s attention, 32 query heads over 4 kv heads of 128; experts uniformly routed):', '',
                  '| kernel | us | TFLOP/s |', '|---|---|---|']
        for row in k['rows']:  # the CUDA-core comparisons stay in the record
            if 'CUDA cores' not in row['name']:
                lines.append(f"| {row['name']} | {row['us']:,.0f} | {row['tflops']:.0f} |")
    lines += ['', 'Commands: ' + '; '.join(sorted({f"`{r['command']}`" for _, r in prefill})[:2]) +
              ' (the rest differ in --input-len and the flags of `strata up` in each record\'s note).', '']
# Strata beside llama.cpp on one checkpoint and card (bench/gpu/peer_call.sh, peer_records.py).
if peer:
    def strata(weights, placement, prompt):
        for n, r in peer:
            if (r['mode'] != 'llama.cpp' and r['weights'] == weights and f'-in{prompt}-' in n
                    and n.split('-out')[1].split('-', 1)[1].startswith(placement)):
                return r
        return None

    lines += ['## Beside llama.cpp', '',
              'The same checkpoint on the same card, in one call (`bench/gpu/peer_call.sh` with',
              '`bench/gpu/plans/peer-12l.txt`): qwen3-30b-a3b\'s shape cut to 12 of 48 layers, bf16',
              'weights with Zipf(1.0) routing; Strata quantizes it to FP8 per channel at load,',
              'llama.cpp converts it to GGUF and q8_0. Batch 1. llama.cpp: `llama-bench` pp512,',
              'pp4096 (prompt tokens per second) and tg128 (generated tokens per second), flash',
              'attention on, 3 repetitions. Strata: `strata bench` on a running cluster, the prompt',
              'over its time to first token (512 and 4,096 tokens, `--max-batch-tokens 4096`) and',
              'the decode rate of 128 tokens after the 512-token prompt. Under a budget llama.cpp',
              'keeps the experts of its first layers on the CPU (`-ncmoe`, the fewest layers that',
              'leave at most 6 GiB of experts on the GPU: 24 GiB scaled by 12 / 48 layers); Strata',
              'gets `--gpu-memory-budget 6GiB` and pages experts in. Its FP8 rows under the budget',
              'run eager decode steps: cold experts stored in bf16 cannot be read in place into FP8',
              'slots (an FP8 checkpoint replays decode graphs, as the bf16 rows here do).', '',
              '| experts | Strata weights | llama.cpp weights | pp512: Strata | llama.cpp | pp4096: Strata | llama.cpp | decode: Strata | llama.cpp | machine |',
              '|---|---|---|---|---|---|---|---|---|---|']
    for n, l in sorted((x for x in peer if x[1]['mode'] == 'llama.cpp'),
                       key=lambda x: (x[1]['n_cpu_moe'] > 0, x[1]['weights'] != 'q8_0')):
        weights = 'fp8' if l['weights'] == 'q8_0' else l['weights']
        placement = 'resident' if l['n_cpu_moe'] == 0 else 'tiered'
        s512, s4k = strata(weights, placement, 512), strata(weights, placement, 4096)
        cell = lambda r, k: f"**{r[k]:,.0f}**" if r else ''
        experts = ('all on the GPU' if l['n_cpu_moe'] == 0 else
                   f"6 GiB budget (llama.cpp: -ncmoe {l['n_cpu_moe']}, {l['expert_gib_on_gpu']:.1f} GiB on the GPU)")
        lines.append(f"| {experts} | {weights} | {l['weights']} | {cell(s512, 'prefill_tok_s')} | "
                     f"{l['pp512_tok_s']:,.0f} | {cell(s4k, 'prefill_tok_s')} | {l['pp4096_tok_s']:,.0f} | "
                     f"{cell(s512, 'decode_tok_s_mean')} | {l['tg128_tok_s']:,.0f} | "
                     f"{l['machine'].split(' (')[0]} |")
    builds = sorted({f"llama.cpp {r['build']}" for _, r in peer if r['mode'] == 'llama.cpp'} |
                    {f"Strata {r.get('commit', '')}" for _, r in peer if r['mode'] != 'llama.cpp'})
    lines += ['', 'Builds: ' + ', '.join(builds) + '. Commands: each record\'s `command` '
              '(bench/results/llama.cpp-qwen3-30b-a3b-12L-*, strata-qwen3-30b-a3b-12L-*).', '']
# What a speculative verify step of k tokens costs against a 1-token step (verify_step_bench).
verify = sorted(glob.glob('bench/profiles/verify-steps-*.json'))
if verify:
    lines += ['## Verify steps', '',
              'One sequence, k tokens in one step after `context` cached ones, every row\'s logits to',
              'the host, in one process (`verify_step_bench`; the 1-token step here is eager, not a',
              'graph replay). On a MoE model a k-token step reads the experts of all k tokens: a',
              'speculative draft pays only where its accepted tokens per step beat this ratio.', '',
              '| model | device, weights | context | k = 1 ms | k = 2 | k = 4 | k = 8 | k = 16 | machine |',
              '|---|---|---|---|---|---|---|---|---|']
    for path in verify:
        v = json.load(open(path))
        by_context = {}
        for step in v['steps']:
            by_context.setdefault(step['context'], {})[step['k']] = step
        for context, ks in sorted(by_context.items()):
            one = ks.get(1, {}).get('step_ms_median', 0)
            cells = [f"{ks[k]['vs_one_token']:.2f}x" if k in ks else '' for k in (2, 4, 8, 16)]
            lines.append(f"| {os.path.basename(v['model'].rstrip('/'))} | {v['device']}, {'float32' if v['device'] == 'cpu' else v['weights']} | "
                         f"{context} | {one:.2f} | " + ' | '.join(cells) + f" | {v.get('machine', '')} |")
    lines += ['', 'Commands: ' + '; '.join(f"`{json.load(open(p))['command']}`" for p in verify), '']
# The commands behind each row live beside the records, not on the page: a user picks a
# configuration from the tables, and finds how it was measured by the row's number there.
commands_path = os.path.join(a.results, 'COMMANDS.md')
commands = ['# Commands of the performance page\'s rows', '',
            'Generated with docs/performance.md by `python3 bench/perf_page.py`: row N of the page\'s',
            'table, its record in this folder and the command that wrote it (the cluster was started',
            'with `strata up` as the record\'s note and the scripts under `bench/gpu/` say; machines: ' +
            ', '.join(sorted({r['machine'] for r in rows if r['machine']})) + ').', '']
for i, r in enumerate(rows, 1):
    commands.append(f"{i}. `{r['file']}`: `{r['command']}`")
commands.append('')
open(commands_path, 'w').write('\n'.join(commands))
lines += ['Each row\'s command: `bench/results/COMMANDS.md`, by the row\'s number.', '']
open(a.out, 'w').write('\n'.join(lines))
print(f'{a.out}: {len(rows)} rows, {len(lines)} lines; {commands_path}')
