#!/usr/bin/env python3
"""Writes a random-weight Hugging Face checkpoint of a benchmark shape with transformers (on the
GPU machine, where torch is): the same files `strata make-model` writes, for the engines that
read them. --layers keeps fewer layers than the shape has (for disks too small for the whole).

    python3 bench/gpu/make_hf_model.py --shape qwen3-30b-a3b --layers 12 --out /tmp/q30
"""
import argparse

import torch
import transformers
from transformers import AutoModelForCausalLM

SHAPES = {
    "qwen3-30b-a3b": lambda layers: transformers.Qwen3MoeConfig(
        vocab_size=151936, hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768,
        num_hidden_layers=layers or 48, num_attention_heads=32, num_key_value_heads=4, head_dim=128,
        num_experts=128, num_experts_per_tok=8, norm_topk_prob=True, tie_word_embeddings=False,
        max_position_embeddings=40960, rope_parameters={"rope_type": "default", "rope_theta": 1e6}),
    "mixtral-8x7b": lambda layers: transformers.MixtralConfig(
        vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=layers or 32,
        num_attention_heads=32, num_key_value_heads=8, num_local_experts=8, num_experts_per_tok=2,
        max_position_embeddings=32768, rope_parameters={"rope_type": "default", "rope_theta": 1e6}),
}

ap = argparse.ArgumentParser()
ap.add_argument("--shape", required=True, choices=sorted(SHAPES))
ap.add_argument("--layers", type=int, default=0)
ap.add_argument("--out", required=True)
a = ap.parse_args()
torch.manual_seed(0)
with torch.device("cuda:0"):
    model = AutoModelForCausalLM.from_config(SHAPES[a.shape](a.layers), dtype=torch.bfloat16)
model.save_pretrained(a.out)
print(f"wrote {a.out}: {sum(p.numel() for p in model.parameters()) / 1e9:.2f}B parameters")
