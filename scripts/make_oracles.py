#!/usr/bin/env python3
"""Make reference ("oracle") test models with Hugging Face transformers.

Each model is a tiny, randomly initialised MoE checkpoint in the real Hugging Face format together
with what transformers computes for it, so that Strata can prove it computes the same function.
Models made (folder names):

  qwen3_moe_long        qwen3_moe, 4 layers, 8 experts top-2 (normalized), prompts of 96 and 130 tokens
  qwen3_moe_dense_tied  qwen3_moe, dense MLP on layers 0 and 2, tied embeddings, 12 experts top-3,
                        head_dim 32 != hidden/heads
  mixtral_long          mixtral, 5 heads / 1 kv head, 4 experts top-2, vocab 640
  qwen2_moe_long        qwen2_moe, shared expert, qkv bias, 6 experts top-2 (not normalized)
  gpt_oss_long          gpt_oss, sliding window 16 on layers 0 and 2, YaRN, sinks, 120-token prompt

Run it where torch and transformers are installed (written for transformers 5.17, torch 2.11):

    python3 scripts/make_oracles.py --out tests/data/oracles [--only NAME ...]

It runs on the CPU only, whatever hardware there is.

Output, one folder per model (the format of tests/data/oracles/README.md):
  config.json, generation_config.json  as written by save_pretrained
  model.safetensors                    bf16 weights (the model cast to bfloat16, then save_pretrained)
  oracle.json                          {"model": arch, "transformers": version, "dtype_ref": "float32",
                                        "name": folder name, "seed": seed, "cases": [...]}
Each case: "prompt" (token ids), "greedy" (the ids greedy decoding appends, do_sample=False, EOS never
stops it), "all_ids" (prompt + greedy), "logits" (one row per position of all_ids, full vocab: the
model run once over all_ids, row i = distribution of the token after position i), "min_top2_margin"
(smallest best-minus-second-best logit gap over all rows).

The reference is the saved bf16 weights reloaded and upcast to float32, eager attention, eager
experts, all math in float32 on the CPU. Logits are written as the shortest decimal that reads back
as the same float32. Parameters that the default init leaves constant (biases, norm weights, sinks)
get random values so those code paths are tested.
"""

import argparse
import json
import os
import struct
import sys
from pathlib import Path

os.environ["CUDA_VISIBLE_DEVICES"] = ""  # the reference is computed on the CPU, always

import torch  # noqa: E402
import transformers  # noqa: E402
from safetensors.torch import load_file  # noqa: E402
from transformers import (  # noqa: E402
    Glm4MoeConfig,
    Glm4MoeForCausalLM,
    GptOssConfig,
    GptOssForCausalLM,
    MixtralConfig,
    MixtralForCausalLM,
    Qwen2MoeConfig,
    Qwen2MoeForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
)

ARCHS = {
    "qwen3_moe": (Qwen3MoeConfig, Qwen3MoeForCausalLM),
    "mixtral": (MixtralConfig, MixtralForCausalLM),
    "qwen2_moe": (Qwen2MoeConfig, Qwen2MoeForCausalLM),
    "gpt_oss": (GptOssConfig, GptOssForCausalLM),
    "glm4_moe": (Glm4MoeConfig, Glm4MoeForCausalLM),
}

# Defaults for every model (a spec may override): a large init so logits are not tiny.
COMMON = dict(initializer_range=0.15, rms_norm_eps=1e-6, max_position_embeddings=2048)

# name -> arch, seed, prompt lengths, new tokens per prompt, expected dense (non-MoE) layers, config.
SPECS = {
    "qwen3_moe_long": dict(
        arch="qwen3_moe", seed=11, prompts=[96, 130], new_tokens=12, dense_layers=[],
        config=dict(vocab_size=768, hidden_size=96, num_hidden_layers=4, num_attention_heads=6,
                    num_key_value_heads=2, head_dim=16, num_experts=8, num_experts_per_tok=2,
                    norm_topk_prob=True, moe_intermediate_size=48, intermediate_size=128,
                    decoder_sparse_step=1, mlp_only_layers=[]),
    ),
    "qwen3_moe_dense_tied": dict(
        # Sparse iff idx not in mlp_only_layers and (idx + 1) % decoder_sparse_step == 0:
        # layer 0 dense (listed), 1 sparse, 2 dense (3 % 2), 3 sparse.
        arch="qwen3_moe", seed=12, prompts=[100, 20], new_tokens=12, dense_layers=[0, 2],
        config=dict(vocab_size=512, hidden_size=80, num_hidden_layers=4, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=32, num_experts=12, num_experts_per_tok=3,
                    norm_topk_prob=False, moe_intermediate_size=24, intermediate_size=128,
                    decoder_sparse_step=2, mlp_only_layers=[0], tie_word_embeddings=True),
    ),
    "mixtral_long": dict(
        # head_dim left null as in real Mixtral configs: 80 / 5 = 16.
        arch="mixtral", seed=13, prompts=[110, 33], new_tokens=12, dense_layers=[],
        config=dict(vocab_size=640, hidden_size=80, num_hidden_layers=3, num_attention_heads=5,
                    num_key_value_heads=1, num_local_experts=4, num_experts_per_tok=2,
                    intermediate_size=112, sliding_window=None),
    ),
    "qwen2_moe_long": dict(
        arch="qwen2_moe", seed=14, prompts=[97, 12], new_tokens=12, dense_layers=[],
        config=dict(vocab_size=512, hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
                    num_key_value_heads=4, num_experts=6, num_experts_per_tok=2,
                    norm_topk_prob=False, moe_intermediate_size=40, intermediate_size=128,
                    shared_expert_intermediate_size=72, qkv_bias=True,
                    decoder_sparse_step=1, mlp_only_layers=[]),
    ),
    "gpt_oss_long": dict(
        arch="gpt_oss", seed=15, prompts=[120, 40], new_tokens=12, dense_layers=[],
        config=dict(vocab_size=512, hidden_size=64, num_hidden_layers=4,
                    layer_types=["sliding_attention", "full_attention"] * 2, sliding_window=16,
                    num_attention_heads=4, num_key_value_heads=1, head_dim=16,
                    num_local_experts=8, num_experts_per_tok=2, intermediate_size=64,
                    attention_bias=True, max_position_embeddings=131072,  # = 4096 * factor 32
                    rope_parameters=dict(rope_type="yarn", rope_theta=150000.0, factor=32.0,
                                         beta_fast=32.0, beta_slow=1.0,
                                         original_max_position_embeddings=4096, truncate=False)),
    ),
    # Head sizes the GPU attention kernel takes (64, 128), for the CUDA backend's test.
    "qwen3_moe_hd64": dict(
        arch="qwen3_moe", seed=21, prompts=[40, 100], new_tokens=8, dense_layers=[],
        config=dict(vocab_size=512, hidden_size=128, num_hidden_layers=3, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=64, num_experts=8, num_experts_per_tok=2,
                    norm_topk_prob=True, moe_intermediate_size=64, intermediate_size=128,
                    decoder_sparse_step=1, mlp_only_layers=[]),
    ),
    "mixtral_hd128": dict(
        arch="mixtral", seed=23, prompts=[50, 9], new_tokens=8, dense_layers=[],
        config=dict(vocab_size=512, hidden_size=256, num_hidden_layers=2, num_attention_heads=2,
                    num_key_value_heads=1, num_local_experts=4, num_experts_per_tok=2,
                    intermediate_size=128, sliding_window=None),
    ),
    "qwen2_moe_hd64": dict(
        arch="qwen2_moe", seed=24, prompts=[60, 11], new_tokens=8, dense_layers=[],
        config=dict(vocab_size=512, hidden_size=256, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=4, num_experts=6, num_experts_per_tok=2,
                    norm_topk_prob=False, moe_intermediate_size=64, intermediate_size=128,
                    shared_expert_intermediate_size=96, qkv_bias=True,
                    decoder_sparse_step=1, mlp_only_layers=[]),
    ),
    "gpt_oss_hd64": dict(
        arch="gpt_oss", seed=22, prompts=[70, 20], new_tokens=8, dense_layers=[],
        config=dict(vocab_size=512, hidden_size=128, num_hidden_layers=2,
                    layer_types=["sliding_attention", "full_attention"], sliding_window=16,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                    num_local_experts=8, num_experts_per_tok=2, intermediate_size=64,
                    attention_bias=True, max_position_embeddings=131072,
                    rope_parameters=dict(rope_type="yarn", rope_theta=150000.0, factor=32.0,
                                         beta_fast=32.0, beta_slow=1.0,
                                         original_max_position_embeddings=4096, truncate=False)),
    ),
    "glm4_moe_hd64": dict(
        # GLM-4.5's pieces at a head size the GPU attention takes: partial rotary (half of each
        # head), q/k norms, q/k/v biases, layer 0 dense, sigmoid group-limited routing x 2.5 and
        # an ungated shared expert. partial_rotary_factor is set after the config is built
        # (set_after): versions keep it at the top level or inside rope_parameters.
        arch="glm4_moe", seed=25, prompts=[60, 12], new_tokens=8, dense_layers=[0],
        config=dict(vocab_size=512, hidden_size=128, num_hidden_layers=3, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=64, intermediate_size=128,
                    moe_intermediate_size=64, n_routed_experts=16, num_experts_per_tok=4,
                    n_shared_experts=1, n_group=4, topk_group=2, routed_scaling_factor=2.5,
                    norm_topk_prob=True, first_k_dense_replace=1, use_qk_norm=True,
                    attention_bias=True),
        set_after=dict(partial_rotary_factor=0.5),
    ),
}

# Expected attention head_dim per model (checked on the built modules).
HEAD_DIM = {"qwen3_moe_long": 16, "qwen3_moe_dense_tied": 32, "mixtral_long": 16,
            "qwen2_moe_long": 16, "gpt_oss_long": 16, "qwen3_moe_hd64": 64, "mixtral_hd128": 128,
            "qwen2_moe_hd64": 64, "gpt_oss_hd64": 64, "glm4_moe_hd64": 64}

MAX_ORACLE_BYTES = 3_000_000


def fail(msg):
    raise SystemExit(f"make_oracles: {msg}")


def make_config(spec):
    """Build the config and check that every requested value really landed (names differ by version)."""
    config_cls, _ = ARCHS[spec["arch"]]
    wanted = {**COMMON, **spec["config"]}
    config = config_cls(**wanted)
    for key, want in wanted.items():
        got = getattr(config, key, "<missing>")
        if isinstance(want, dict):  # rope_parameters: the config may add keys, but not change ours
            ok = isinstance(got, dict) and all(got.get(k) == v for k, v in want.items())
        else:
            ok = got == want
        if not ok:
            fail(f"{spec['arch']} config: {key} = {got!r}, wanted {want!r}")
    if config.model_type != spec["arch"]:
        fail(f"model_type {config.model_type!r} != {spec['arch']!r}")
    for key, value in spec.get("set_after", {}).items():
        setattr(config, key, value)
        if isinstance(getattr(config, "rope_parameters", None), dict):
            config.rope_parameters[key] = value
    return config


@torch.no_grad()
def randomize_constant_params(model, seed):
    """Give random values to parameters the default init leaves constant (biases at 0, norms at 1),
    and to gpt-oss attention sinks, so that those paths are tested."""
    gen = torch.Generator().manual_seed(seed + 1000)
    for name, p in model.named_parameters():
        noise = torch.randn(p.shape, generator=gen, dtype=torch.float32).to(p.dtype)
        if name.endswith("sinks"):
            p.copy_(noise)  # std 1
        elif torch.all(p == 0):
            p.copy_(0.1 * noise)
        elif torch.all(p == 1):
            p.copy_(1 + 0.1 * noise)
    for name, p in model.named_parameters():
        if p.numel() > 1 and torch.all(p == p.flatten()[0]):
            fail(f"parameter {name} is still constant after init")


def check_structure(name, spec, model):
    layers = model.model.layers
    dense = [i for i, layer in enumerate(layers) if not hasattr(layer.mlp, "experts")]
    if dense != spec["dense_layers"]:
        fail(f"{name}: dense layers {dense}, wanted {spec['dense_layers']}")
    for layer in layers:
        if layer.self_attn.head_dim != HEAD_DIM[name]:
            fail(f"{name}: head_dim {layer.self_attn.head_dim}, wanted {HEAD_DIM[name]}")
    if model.config.tie_word_embeddings and not torch.equal(
        model.lm_head.weight, model.model.embed_tokens.weight
    ):
        fail(f"{name}: tie_word_embeddings is set but lm_head != embed_tokens")


def build_and_save(name, spec, out_dir):
    """Random model, cast to bf16, saved. Returns the bf16 state dict as it was saved."""
    torch.manual_seed(spec["seed"])
    config = make_config(spec)
    _, model_cls = ARCHS[spec["arch"]]
    model = model_cls(config)
    randomize_constant_params(model, spec["seed"])
    check_structure(name, spec, model)
    model.to(torch.bfloat16)
    # transformers 5 always writes safetensors (safe_serialization is gone from the signature).
    model.save_pretrained(out_dir)
    weights = out_dir / "model.safetensors"
    if not weights.is_file():
        fail(f"{name}: save_pretrained wrote no {weights}")
    saved = load_file(str(weights))
    if any(t.dtype != torch.bfloat16 for t in saved.values()):
        fail(f"{name}: model.safetensors holds non-bf16 tensors")
    if config.tie_word_embeddings and "lm_head.weight" in saved and not torch.equal(
        saved["lm_head.weight"], saved["model.embed_tokens.weight"]
    ):
        fail(f"{name}: saved lm_head.weight differs from embed_tokens with tied embeddings")
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def load_reference(name, spec, out_dir, saved_state):
    """Reload the saved bf16 weights as float32, eager everything, CPU, and check they round-trip."""
    _, model_cls = ARCHS[spec["arch"]]
    model = model_cls.from_pretrained(
        out_dir, dtype=torch.float32, attn_implementation="eager", experts_implementation="eager"
    )
    model.eval()
    state = model.state_dict()
    if set(state) != set(saved_state):
        fail(f"{name}: reloaded keys differ: {sorted(set(state) ^ set(saved_state))}")
    for key, tensor in state.items():
        if tensor.dtype != torch.float32 or tensor.device.type != "cpu":
            fail(f"{name}: reloaded {key} is {tensor.dtype} on {tensor.device}")
        if not torch.equal(tensor, saved_state[key].float()):
            fail(f"{name}: reloaded {key} differs from the saved bf16 weights")
    check_structure(name, spec, model)
    # Greedy decoding must never stop early: no EOS at all (generate would fill a None from here).
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = None
    return model


def make_prompts(spec, config):
    """Random prompts from a seeded generator, avoiding ids 0-2 and any special token id."""
    special = set()
    for tok in (config.bos_token_id, config.eos_token_id, config.pad_token_id):
        special.update(tok if isinstance(tok, list) else [tok])
    allowed = torch.tensor([i for i in range(3, config.vocab_size) if i not in special])
    gen = torch.Generator().manual_seed(spec["seed"])
    return [allowed[torch.randint(len(allowed), (n,), generator=gen)].tolist() for n in spec["prompts"]]


def f32_shortest(x):
    """The shortest decimal that reads back as the same float32 (x is a float32 value)."""
    for digits in range(6, 10):
        s = f"{x:.{digits}g}"
        if struct.unpack("<f", struct.pack("<f", float(s)))[0] == x:
            return float(s)
    return x


@torch.no_grad()
def run_case(name, model, prompt, new_tokens):
    ids = torch.tensor([prompt], dtype=torch.long)
    out = model.generate(
        ids, attention_mask=torch.ones_like(ids), do_sample=False,
        max_new_tokens=new_tokens, min_new_tokens=new_tokens,
    )
    greedy = out[0, len(prompt):].tolist()
    if len(greedy) != new_tokens:
        fail(f"{name}: generate gave {len(greedy)} tokens, wanted {new_tokens}")
    all_ids = prompt + greedy

    # Teacher forcing: one pass over prompt + greedy; row i predicts the token after position i.
    logits = model(input_ids=torch.tensor([all_ids]), use_cache=False).logits[0].float()
    if logits.shape != (len(all_ids), model.config.vocab_size):
        fail(f"{name}: logits shape {tuple(logits.shape)}")
    if not torch.isfinite(logits).all():
        fail(f"{name}: non-finite logits")
    argmax = logits[len(prompt) - 1:-1].argmax(dim=-1).tolist()
    if argmax != greedy:
        fail(f"{name}: greedy {greedy} != teacher-forced argmax {argmax} (near-tie? try another seed)")
    top2 = logits.topk(2, dim=-1).values
    margin = (top2[:, 0] - top2[:, 1]).min().item()
    return {
        "prompt": prompt,
        "greedy": greedy,
        "all_ids": all_ids,
        "logits": [[f32_shortest(v) for v in row] for row in logits.tolist()],
        "min_top2_margin": margin,
    }


def make_one(name, out_root):
    spec = SPECS[name]
    out_dir = out_root / name
    out_dir.mkdir(parents=True, exist_ok=True)
    saved_state = build_and_save(name, spec, out_dir)
    model = load_reference(name, spec, out_dir, saved_state)
    cases = [run_case(name, model, p, spec["new_tokens"]) for p in make_prompts(spec, model.config)]
    oracle = {
        "model": spec["arch"],
        "transformers": transformers.__version__,
        "dtype_ref": "float32",
        "name": name,
        "seed": spec["seed"],
        "cases": cases,
    }
    path = out_dir / "oracle.json"
    path.write_text(json.dumps(oracle, separators=(",", ":")))
    size = path.stat().st_size
    margins = ", ".join(f"{c['min_top2_margin']:.2e}" for c in cases)
    print(f"{name}: {len(cases)} cases, prompts {spec['prompts']}, oracle.json {size / 1e6:.2f} MB, "
          f"min_top2_margin {margins}")
    if size > MAX_ORACLE_BYTES:
        print(f"warning: {path} is over {MAX_ORACLE_BYTES / 1e6:.0f} MB", file=sys.stderr)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, type=Path, help="output root; one folder per model")
    parser.add_argument("--only", action="append", choices=sorted(SPECS), metavar="NAME",
                        help=f"make only this model (repeatable): {', '.join(SPECS)}")
    args = parser.parse_args()
    torch.set_grad_enabled(False)
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, CPU float32 reference")
    for name in args.only or list(SPECS):
        make_one(name, args.out)


if __name__ == "__main__":
    main()
