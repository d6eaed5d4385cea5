#!/usr/bin/env python3
"""Reference figures for a held-out text file, computed with transformers (float32 math from
the stored bf16 weights): what `strata eval` must reproduce.

    python3 tools/train/heldout_reference.py --model models/strata-demo \
        --text tests/data/heldout/strata-demo-valid.txt --out OUT.json

Method (the same as `strata eval`): the file is encoded with the model's tokenizer.json without
special tokens; the ids are cut into consecutive windows of --window tokens (the last may be
shorter; one of a single token is dropped); each window runs from position 0 with no BOS, and
positions 1..len-1 are scored. perplexity = exp(mean negative log-likelihood). Repeated for
each gate temperature (gate logits divided by T, done by scaling the gate weights by 1/T).
Also records, at T = 1, the argmax token of every scored position and the number of times each
expert of each MoE layer was selected (for the activation Gini).
"""
import argparse
import json
import math

import torch
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM


def windows(ids, size):
    out = [ids[i:i + size] for i in range(0, len(ids), size)]
    return [w for w in out if len(w) >= 2]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--text", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--window", type=int, default=256)
    p.add_argument("--temperatures", default="1.0,0.7,0.5")
    args = p.parse_args()

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    device = "cuda" if torch.cuda.is_available() else "cpu"
    tok = Tokenizer.from_file(f"{args.model}/tokenizer.json")
    text = open(args.text, encoding="utf-8").read()
    ids = tok.encode(text, add_special_tokens=False).ids
    model = AutoModelForCausalLM.from_pretrained(
        args.model, dtype=torch.float32, attn_implementation="eager",
        experts_implementation="eager").to(device).eval()
    gates = [m for name, m in model.named_modules() if name.endswith("mlp.gate")]
    originals = [g.weight.detach().clone() for g in gates]
    top_k = model.config.num_experts_per_tok
    result = {"model": args.model, "text": args.text, "window": args.window, "tokens_in_file": len(ids),
              "method": __doc__.split("Method")[1].strip(), "by_temperature": {}}
    for t in [float(x) for x in args.temperatures.split(",")]:
        for g, w in zip(gates, originals):
            g.weight.data.copy_(w / t)
        nll, scored, argmax = 0.0, 0, []
        counts = [[0] * model.config.num_local_experts for _ in gates]
        hooks = []
        if t == 1.0:
            for li, g in enumerate(gates):
                def hook(mod, inp, out, li=li):
                    # The gate's full logits: the output tensor with one column per expert.
                    outs = out if isinstance(out, tuple) else (out,)
                    logits = next(o for o in outs if torch.is_tensor(o) and o.shape[-1] == len(counts[li]))
                    for e in torch.topk(logits.float(), top_k, dim=-1).indices.flatten().tolist():
                        counts[li][e] += 1
                hooks.append(g.register_forward_hook(hook))
        with torch.no_grad():
            for w in windows(ids, args.window):
                x = torch.tensor([w], device=device)
                logits = model(x).logits[0].float()
                logp = torch.log_softmax(logits[:-1], dim=-1)
                target = x[0, 1:]
                nll -= logp.gather(1, target[:, None]).sum().item()
                scored += len(w) - 1
                if t == 1.0:
                    argmax += logits[:-1].argmax(-1).tolist()
        for h in hooks:
            h.remove()
        entry = {"perplexity": math.exp(nll / scored), "tokens": scored}
        if t == 1.0:
            entry["argmax"] = argmax
            entry["expert_counts"] = counts
        result["by_temperature"][str(t)] = entry
        print(f"T={t}: perplexity {entry['perplexity']:.4f} over {scored} tokens", flush=True)
    json.dump(result, open(args.out, "w"))


if __name__ == "__main__":
    main()
