#!/usr/bin/env python3
"""Train Strata's demo model: a ~19M-parameter qwen3_moe (Qwen3MoeForCausalLM).

Runs on one CUDA GPU with PyTorch and transformers 5.x; reads only the output of
tools/train/prepare_data.sh (DATA = data/corpus/bin):

    DATA/train.bin, DATA/valid.bin   uint16 token streams (<|endoftext|> = 0 between documents)
    DATA/tokenizer.json              byte-level BPE, 8192 tokens
    DATA/meta.json                   token counts, sources, sha256s

    python3 tools/train/train.py --data data/corpus/bin --out models/strata-demo [--minutes 6]

Training: random windows of --seq-len tokens from train.bin, bf16 autocast over fp32
weights, AdamW (0.9, 0.95), linear warm-up then cosine decay to 10 %, gradient
clipping at 1.0, load-balancing auxiliary loss (router_aux_loss_coef).  The number of
steps is the smallest of --steps (if given), --max-epochs passes over train.bin, and
what fits in --minutes (measured on the first steps); the model with the lowest loss
on the "selection" slice of valid.bin (its last --ref-ctx * --ref-windows tokens) is
kept.  Seeded, but GPU kernels (index_add_, atomics) make runs not bit-identical.

Output in --out: config.json, generation_config.json, model.safetensors (bf16, the
Hugging Face Qwen3-MoE layout with one tensor per expert projection, lm_head tied to
the embedding and not stored), tokenizer.json, tokenizer_config.json, README.md and
reference.json.  reference.json holds figures computed after reloading the saved
bf16 weights with transformers in float32 (TF32 off), on the "reference" slice of
valid.bin (its first --ref-ctx * --ref-windows tokens, disjoint from the selection
slice):

    valid_ppl: window i is tokens [i*C, (i+1)*C) of valid.bin, C = --ref-ctx, for
    i < --ref-windows; every window is one forward pass from position 0 (no BOS added,
    no state carried between windows); positions 1..C-1 of each window are scored, so
    W*(C-1) predictions; ppl = exp(mean negative log-likelihood, natural log).

and greedy continuations (argmax, exactly --gen-tokens new tokens, <|endoftext|> is
not a stop) of fixed prompts, fed as [<|endoftext|>] + tokenizer.encode(prompt).
"""

from __future__ import annotations

import argparse
import copy
import datetime
import hashlib
import json
import math
import os
import platform
import re
import shutil
import sys
import time

T0 = time.time()

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

EOT = "<|endoftext|>"
PROMPTS = [
    "Once upon a time",
    "It is a truth universally acknowledged",
    "In the beginning God created",
]


def log(msg: str) -> None:
    print(f"[{time.time() - T0:7.1f}s] {msg}", flush=True)


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default="data/corpus/bin")
    ap.add_argument("--out", default="models/strata-demo")
    ap.add_argument("--minutes", type=float, default=6.0,
                    help="wall-clock budget from process start to the end of training "
                         "(saving and the reference figures come after, ~0.5 min)")
    ap.add_argument("--steps", type=int, default=0, help="fixed number of steps (0: derive)")
    ap.add_argument("--max-epochs", type=float, default=12.0,
                    help="cap on passes over train.bin (the data is small)")
    ap.add_argument("--seed", type=int, default=1234)
    # model
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--experts", type=int, default=16)
    ap.add_argument("--top-k", type=int, default=4)
    ap.add_argument("--moe-inter", type=int, default=160)
    ap.add_argument("--max-pos", type=int, default=2048)
    ap.add_argument("--rope-theta", type=float, default=10000.0)
    ap.add_argument("--aux-coef", type=float, default=0.01)
    # optimisation
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--lr", type=float, default=1.5e-3)
    ap.add_argument("--min-lr-ratio", type=float, default=0.1)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--grad-clip", type=float, default=1.0)
    ap.add_argument("--experts-impl", default="auto",
                    help="auto (time grouped_mm and eager, keep the faster), eager, grouped_mm")
    ap.add_argument("--compile", action="store_true", help="torch.compile the model (off by default)")
    ap.add_argument("--evals", type=int, default=10, help="evaluations during training")
    # reference figures
    ap.add_argument("--ref-ctx", type=int, default=256)
    ap.add_argument("--ref-windows", type=int, default=256)
    ap.add_argument("--gen-tokens", type=int, default=32)
    return ap.parse_args()


# --------------------------------------------------------------------------- model


def build_config(args, vocab: int, eot: int):
    from transformers import Qwen3MoeConfig

    kw = dict(
        vocab_size=vocab,
        hidden_size=args.hidden,
        intermediate_size=args.top_k * args.moe_inter,  # unused: every layer is sparse
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        head_dim=args.head_dim,
        hidden_act="silu",
        max_position_embeddings=args.max_pos,
        initializer_range=0.02,
        rms_norm_eps=1e-6,
        use_cache=True,
        tie_word_embeddings=True,
        attention_bias=False,
        use_sliding_window=False,
        attention_dropout=0.0,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        moe_intermediate_size=args.moe_inter,
        num_experts_per_tok=args.top_k,
        num_experts=args.experts,
        norm_topk_prob=True,
        output_router_logits=True,
        router_aux_loss_coef=args.aux_coef,
        bos_token_id=eot,
        eos_token_id=eot,
        # no pad id in the model config: transformers would pass it to nn.Embedding as
        # padding_idx and the <|endoftext|> embedding would get no gradient
        pad_token_id=None,
    )
    rope = {"rope_type": "default", "rope_theta": float(args.rope_theta)}
    try:
        cfg = Qwen3MoeConfig(**kw, rope_parameters=rope)
    except TypeError:  # transformers 4.x naming
        cfg = Qwen3MoeConfig(**kw, rope_theta=float(args.rope_theta))

    def get(*names):
        for n in names:
            v = getattr(cfg, n, None)
            if v is not None:
                return v
        return None

    checks = {
        "num_experts": (get("num_experts", "num_local_experts"), args.experts),
        "num_experts_per_tok": (get("num_experts_per_tok"), args.top_k),
        "moe_intermediate_size": (get("moe_intermediate_size"), args.moe_inter),
        "head_dim": (get("head_dim") or args.hidden // args.heads, args.head_dim),
        "norm_topk_prob": (get("norm_topk_prob"), True),
        "tie_word_embeddings": (get("tie_word_embeddings"), True),
        "vocab_size": (get("vocab_size"), vocab),
    }
    for name, (have, want) in checks.items():
        if have != want:
            raise SystemExit(f"config check failed: {name} = {have!r}, wanted {want!r}")
    theta = None
    rp = getattr(cfg, "rope_parameters", None)
    if isinstance(rp, dict):
        theta = rp.get("rope_theta")
    theta = theta if theta is not None else getattr(cfg, "rope_theta", None)
    if theta is None or abs(float(theta) - args.rope_theta) > 1e-6:
        raise SystemExit(f"config check failed: rope theta = {theta!r}")
    return cfg


def expected_params(args, vocab: int) -> dict:
    H, L, E, I = args.hidden, args.layers, args.experts, args.moe_inter
    q = H * args.heads * args.head_dim
    kv = 2 * H * args.kv_heads * args.head_dim
    o = args.heads * args.head_dim * H
    attn = q + kv + o + 2 * args.head_dim  # + q_norm, k_norm
    experts = E * 3 * H * I
    router = E * H
    norms = 2 * H
    per_layer = attn + experts + router + norms
    emb = vocab * H
    total = emb + L * per_layer + H
    active = total - L * experts + L * args.top_k * 3 * H * I
    return {"total": total, "embedding": emb, "per_layer": per_layer,
            "experts_per_layer": experts, "attention_per_layer": attn,
            "router_per_layer": router, "active_per_token": active}


def init_weights(model, args) -> None:
    """Explicit, seeded initialisation (independent of transformers' defaults)."""
    std = 0.02
    resid_std = std / math.sqrt(2 * args.layers)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.fill_(1.0)  # RMSNorm weights
            elif name.endswith("o_proj.weight") or name.endswith("experts.down_proj") \
                    or name.endswith("down_proj.weight"):
                p.normal_(0.0, resid_std)
            else:
                p.normal_(0.0, std)


def set_experts_impl(model, name: str) -> None:
    if hasattr(model, "set_experts_implementation"):
        model.set_experts_implementation(name)
    else:
        model.config._experts_implementation = name


def get_experts_impl(model) -> str:
    for attr in ("_experts_implementation", "experts_implementation"):
        v = getattr(model.config, attr, None)
        if v is not None:
            return str(v)
    return "unknown"


# --------------------------------------------------------------------------- data


def load_tokens(path: str) -> np.ndarray:
    arr = np.fromfile(path, dtype="<u2")
    if arr.size == 0:
        raise SystemExit(f"{path} is empty")
    return arr


def sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def windows(tokens: torch.Tensor, ctx: int, n: int, from_end: bool = False) -> torch.Tensor:
    total = tokens.numel()
    n = min(n, total // ctx)
    start = total - n * ctx if from_end else 0
    return tokens[start:start + n * ctx].view(n, ctx)


@torch.no_grad()
def eval_nll(model, wins: torch.Tensor, batch: int, autocast: bool,
             expert_counts: list | None = None) -> tuple[float, int]:
    """Sum of negative log-likelihoods of positions 1..C-1 of every window."""
    total, count = 0.0, 0
    for i in range(0, wins.size(0), batch):
        x = wins[i:i + batch]
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            out = model(input_ids=x, use_cache=False,
                        output_router_logits=expert_counts is not None)
        logits = out.logits[:, :-1, :].float()
        nll = F.cross_entropy(logits.reshape(-1, logits.size(-1)), x[:, 1:].reshape(-1),
                              reduction="sum")
        total += float(nll.item())
        count += x[:, 1:].numel()
        if expert_counts is not None and out.router_logits is not None:
            for layer, rl in enumerate(out.router_logits):
                probs = torch.softmax(rl.float(), dim=-1)
                sel = torch.topk(probs, model.config.num_experts_per_tok, dim=-1).indices
                expert_counts[layer] += torch.bincount(
                    sel.reshape(-1), minlength=probs.size(-1)).cpu().numpy()
    return total, count


# --------------------------------------------------------------------------- saving


def to_hf_layout(sd: dict, cfg, tied: bool) -> dict:
    """Fused 3-D expert tensors (transformers 5) -> one tensor per expert and
    projection, the layout of Qwen3-MoE checkpoints on the Hugging Face hub."""
    H, I = cfg.hidden_size, cfg.moe_intermediate_size
    out = {}
    for k, v in sd.items():
        if tied and k == "lm_head.weight":
            continue
        m = re.match(r"^(.*\.mlp\.experts)\.gate_up_proj$", k)
        if m:
            if tuple(v.shape[1:]) != (2 * I, H):
                raise ValueError(f"unexpected {k} shape {tuple(v.shape)}")
            for e in range(v.shape[0]):
                out[f"{m.group(1)}.{e}.gate_proj.weight"] = v[e, :I, :].clone().contiguous()
                out[f"{m.group(1)}.{e}.up_proj.weight"] = v[e, I:, :].clone().contiguous()
            continue
        m = re.match(r"^(.*\.mlp\.experts)\.(gate_proj|up_proj|down_proj)$", k)
        if m:  # separate 3-D tensors (other transformers versions)
            want = (H, I) if m.group(2) == "down_proj" else (I, H)
            if tuple(v.shape[1:]) != want:
                raise ValueError(f"unexpected {k} shape {tuple(v.shape)}")
            for e in range(v.shape[0]):
                out[f"{m.group(1)}.{e}.{m.group(2)}.weight"] = v[e].clone().contiguous()
            continue
        out[k] = v.clone().contiguous()
    return out


def write_config(cfg, out_dir: str) -> None:
    c = copy.deepcopy(cfg)
    c.output_router_logits = False
    c.use_cache = True
    c.architectures = ["Qwen3MoeForCausalLM"]
    for attr in ("dtype", "torch_dtype"):
        try:
            setattr(c, attr, "bfloat16")
        except Exception:
            pass
    c.save_pretrained(out_dir)
    path = os.path.join(out_dir, "config.json")
    with open(path) as f:
        d = json.load(f)
    plain = dict(d)
    # Keys that Qwen3-MoE checkpoints on the hub (and other readers) use.
    if "num_experts" not in d and "num_local_experts" in d:
        d["num_experts"] = d["num_local_experts"]
    rp = d.get("rope_parameters")
    if "rope_theta" not in d and isinstance(rp, dict) and "rope_theta" in rp:
        d["rope_theta"] = rp["rope_theta"]
    d.setdefault("head_dim", cfg.head_dim)
    d.setdefault("torch_dtype", "bfloat16")
    d["architectures"] = ["Qwen3MoeForCausalLM"]
    with open(path, "w") as f:
        json.dump(dict(sorted(d.items())), f, indent=2)
        f.write("\n")
    try:  # the extra keys must not break transformers
        from transformers import AutoConfig
        back = AutoConfig.from_pretrained(out_dir)
        n = getattr(back, "num_experts", None) or getattr(back, "num_local_experts", None)
        assert n == cfg.num_experts and back.model_type == "qwen3_moe"
    except Exception as e:  # fall back to what transformers wrote itself
        log(f"config.json with compatibility keys did not reload ({e!r}); writing plain")
        with open(path, "w") as f:
            json.dump(plain, f, indent=2)
            f.write("\n")


def write_tokenizer_files(data_dir: str, out_dir: str, eot: int, max_len: int) -> None:
    shutil.copyfile(os.path.join(data_dir, "tokenizer.json"), os.path.join(out_dir, "tokenizer.json"))
    tc = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": EOT,
        "eos_token": EOT,
        "pad_token": EOT,
        "unk_token": None,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": max_len,
        "added_tokens_decoder": {
            str(eot): {"content": EOT, "lstrip": False, "normalized": False,
                       "rstrip": False, "single_word": False, "special": True}
        },
    }
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump(tc, f, indent=2)
        f.write("\n")


def load_saved(out_dir: str, device):
    from transformers import Qwen3MoeForCausalLM
    kwargs = {"experts_implementation": "eager", "attn_implementation": "eager"}
    last = None
    for dt_key in ("dtype", "torch_dtype"):
        for extra in (kwargs, {"attn_implementation": "eager"}, {}):
            try:
                m = Qwen3MoeForCausalLM.from_pretrained(out_dir, **{dt_key: torch.float32}, **extra)
                try:
                    set_experts_impl(m, "eager")
                except Exception:
                    pass
                return m.to(device).eval()
            except TypeError as e:
                last = e
    raise RuntimeError(f"could not reload the saved model: {last!r}")


# --------------------------------------------------------------------------- main


def main() -> int:
    args = parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("a CUDA GPU is required")
    device = torch.device("cuda")
    torch.manual_seed(args.seed)
    np.random.seed(args.seed)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    deadline = T0 + args.minutes * 60.0

    import transformers
    from tokenizers import Tokenizer
    from transformers import Qwen3MoeForCausalLM

    log(f"torch {torch.__version__}, transformers {transformers.__version__}, "
        f"GPU {torch.cuda.get_device_name(0)}")

    # ---- data
    tok = Tokenizer.from_file(os.path.join(args.data, "tokenizer.json"))
    vocab, eot = tok.get_vocab_size(), tok.token_to_id(EOT)
    if eot is None:
        raise SystemExit("tokenizer has no <|endoftext|>")
    meta = {}
    if os.path.exists(os.path.join(args.data, "meta.json")):
        with open(os.path.join(args.data, "meta.json")) as f:
            meta = json.load(f)
    train_np = load_tokens(os.path.join(args.data, "train.bin"))
    valid_np = load_tokens(os.path.join(args.data, "valid.bin"))
    for name, arr in (("train", train_np), ("valid", valid_np)):
        if int(arr.max()) >= vocab:
            raise SystemExit(f"{name}.bin has token ids >= vocab size {vocab}")
    train = torch.from_numpy(train_np.astype(np.int64)).to(device)
    valid = torch.from_numpy(valid_np.astype(np.int64)).to(device)
    ref_wins = windows(valid, args.ref_ctx, args.ref_windows)
    sel_wins = windows(valid, args.ref_ctx, args.ref_windows, from_end=True)
    if ref_wins.size(0) * args.ref_ctx + sel_wins.size(0) * args.ref_ctx > valid.numel():
        log("warning: valid.bin is too small for disjoint reference and selection slices")
    log(f"data: train {train.numel():,} tokens, valid {valid.numel():,} tokens, vocab {vocab}, eot {eot}")

    # ---- model
    cfg = build_config(args, vocab, eot)
    torch.manual_seed(args.seed)
    model = Qwen3MoeForCausalLM(cfg)
    init_weights(model, args)
    try:
        model.tie_weights()
    except Exception as e:
        log(f"tie_weights: {e!r}")
    model.to(device)
    if getattr(model.model.embed_tokens, "padding_idx", None) is not None:
        raise SystemExit("embed_tokens has a padding_idx; its row would not be trained")
    if model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr():
        raise SystemExit("lm_head is not tied to embed_tokens")
    n_params = sum(p.numel() for p in model.parameters())
    exp = expected_params(args, vocab)
    log(f"model: {n_params:,} parameters (expected {exp['total']:,}), "
        f"active per token {exp['active_per_token']:,}, bf16 size {n_params * 2 / 1e6:.1f} MB")
    if n_params != exp["total"]:
        log("warning: parameter count differs from the formula; check the architecture")
    for name, p in model.named_parameters():
        if "layers.0." in name:
            log(f"  {name} {tuple(p.shape)}")

    # ---- optimiser
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": args.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    try:
        opt = torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.95), eps=1e-8, fused=True)
    except Exception:
        opt = torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.95), eps=1e-8)

    B, T = args.batch_size, args.seq_len
    gen = torch.Generator(device="cpu").manual_seed(args.seed)
    ar = torch.arange(T, device=device)

    def get_batch():
        ix = torch.randint(0, train.numel() - T, (B,), generator=gen).to(device)
        return train[ix[:, None] + ar[None, :]]

    def fwd_bwd(x):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = model(input_ids=x, labels=x, use_cache=False, output_router_logits=True)
        out.loss.backward()
        return out

    # ---- experts implementation
    model.train()
    candidates = ["grouped_mm", "eager"] if args.experts_impl == "auto" else [args.experts_impl]
    probe = train[: B * T].view(B, T)
    timings, probe_loss, aux_seen = {}, {}, False
    for impl in candidates:
        try:
            set_experts_impl(model, impl)
            fwd_bwd(probe)  # warm-up
            torch.cuda.synchronize()
            t = time.time()
            losses = []
            for _ in range(3):
                out = fwd_bwd(probe)
                losses.append(float(out.loss.item()))
            torch.cuda.synchronize()
            dt = (time.time() - t) / 3
            if not all(math.isfinite(v) for v in losses):
                raise RuntimeError(f"non-finite loss {losses}")
            aux_seen = aux_seen or out.aux_loss is not None
            timings[impl], probe_loss[impl] = dt, losses[-1]
            log(f"experts '{impl}': {dt * 1000:.1f} ms per step (fwd+bwd), loss {losses[-1]:.4f}, "
                f"aux {float(out.aux_loss) if out.aux_loss is not None else None}")
        except Exception as e:
            log(f"experts '{impl}' unusable: {type(e).__name__}: {str(e)[:300]}")
        finally:
            opt.zero_grad(set_to_none=True)
    if not timings:
        raise SystemExit("no experts implementation works")
    if "eager" in probe_loss and "grouped_mm" in probe_loss \
            and abs(probe_loss["eager"] - probe_loss["grouped_mm"]) > 0.02:
        log("warning: grouped_mm and eager disagree; using eager")
        timings = {"eager": timings["eager"]}
    impl = min(timings, key=timings.get)
    set_experts_impl(model, impl)
    log(f"using experts implementation '{impl}' ({get_experts_impl(model)})")
    if not aux_seen:
        log("warning: no aux loss returned; router load balancing is off")

    train_model = model
    if args.compile:
        try:
            train_model = torch.compile(model)
        except Exception as e:
            log(f"torch.compile failed ({e!r}); eager")
            train_model = model

    # ---- schedule
    tokens_per_step = B * T
    epoch_steps = int(args.max_epochs * train.numel() / tokens_per_step)
    total = args.steps if args.steps > 0 else None

    def lr_at(step: int, total_steps: int) -> float:
        if step < args.warmup:
            return args.lr * (step + 1) / args.warmup
        prog = min(1.0, (step - args.warmup) / max(1, total_steps - args.warmup))
        return args.lr * (args.min_lr_ratio + (1 - args.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * prog)))

    history = []
    best = {"loss": float("inf"), "step": -1, "state": None}
    step, t_train0 = 0, time.time()
    calib_from, calib_to = 10, 40
    t_calib = None
    loss_acc, loss_n, aux_acc = torch.zeros((), device=device), 0, torch.zeros((), device=device)
    eval_every = None

    def evaluate(step_now: int, lr_now: float):
        model.eval()
        nll, cnt = eval_nll(model, sel_wins, 64, autocast=True)
        model.train()
        vloss = nll / cnt
        tl = float((loss_acc / loss_n).item()) if loss_n else None
        rec = {"step": step_now, "epoch": round(step_now * tokens_per_step / train.numel(), 3),
               "train_loss": round(tl, 4) if tl is not None else None,
               "select_loss": round(vloss, 4),
               "select_ppl": round(math.exp(vloss), 3), "lr": lr_now,
               "elapsed_s": round(time.time() - T0, 1)}
        history.append(rec)
        if vloss < best["loss"]:
            best.update(loss=vloss, step=step_now,
                        state={k: v.detach().clone() for k, v in model.state_dict().items()})
        log(f"eval step {step_now}: train {tl if tl is None else round(tl, 4)}  valid(select) {vloss:.4f} "
            f"(ppl {math.exp(vloss):.2f})  lr {lr_now:.2e}")

    log(f"training: batch {B} x {T} = {tokens_per_step:,} tokens/step, "
        f"{args.max_epochs} epochs = {epoch_steps} steps max, budget until "
        f"{deadline - T0:.0f}s after start")
    while True:
        if total is not None and step >= total:
            break
        if total is None and step == calib_to:
            torch.cuda.synchronize()
            per_step = (time.time() - t_calib) / (calib_to - calib_from)
            evals_cost = args.evals * 2.0
            fit = int((deadline - time.time() - evals_cost) / per_step) + step
            total = max(args.warmup + 50, min(fit, epoch_steps))
            log(f"{per_step * 1000:.1f} ms/step -> {total} steps "
                f"({total * tokens_per_step / train.numel():.2f} epochs; "
                f"time allows {fit}, epochs allow {epoch_steps})")
        if total is not None and eval_every is None:
            eval_every = max(50, total // max(1, args.evals))
        if step == calib_from:
            torch.cuda.synchronize()
            t_calib = time.time()
        if time.time() > deadline + 30:
            log(f"warning: past the time budget at step {step}; stopping early")
            break

        lr = lr_at(step, total if total is not None else 10**9)
        for g in opt.param_groups:
            g["lr"] = lr
        x = get_batch()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = train_model(input_ids=x, labels=x, use_cache=False, output_router_logits=True)
        out.loss.backward()
        if args.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        aux = out.aux_loss if out.aux_loss is not None else torch.zeros((), device=device)
        loss_acc += (out.loss.detach() - args.aux_coef * aux.detach())
        aux_acc += aux.detach()
        loss_n += 1
        step += 1

        if step % 100 == 0:
            log(f"step {step}/{total if total else '?'}  loss {float((loss_acc / loss_n).item()):.4f}  "
                f"aux {float((aux_acc / loss_n).item()):.4f}  lr {lr:.2e}")
        if eval_every is not None and (step % eval_every == 0 or step == total):
            evaluate(step, lr)
            loss_acc.zero_(); aux_acc.zero_(); loss_n = 0
    train_seconds = time.time() - t_train0
    if not history or history[-1]["step"] != step:
        evaluate(step, lr_at(step, total or step))
    log(f"trained {step} steps in {train_seconds:.0f}s; best valid(select) loss "
        f"{best['loss']:.4f} at step {best['step']}")
    if best["state"] is not None and best["step"] != step:
        model.load_state_dict(best["state"])
        log(f"restored the weights of step {best['step']}")
    del best["state"]

    # ---- save
    out_dir = args.out
    os.makedirs(out_dir, exist_ok=True)
    sd = {k: v.detach().to(torch.bfloat16).cpu() for k, v in model.state_dict().items()}
    from safetensors.torch import save_file
    from transformers import GenerationConfig

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    try:
        torch.set_float32_matmul_precision("highest")
    except Exception:
        pass

    def save(layout: str) -> dict:
        if layout == "hf-per-expert":
            tensors = to_hf_layout(sd, cfg, tied=True)
            save_file(tensors, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
        else:  # whatever this transformers version writes itself
            m16 = copy.deepcopy(model).to(torch.bfloat16)
            m16.config.output_router_logits = False
            m16.save_pretrained(out_dir, safe_serialization=True)
            del m16
            from safetensors.torch import load_file
            tensors = load_file(os.path.join(out_dir, "model.safetensors"))
        write_config(cfg, out_dir)
        GenerationConfig(bos_token_id=eot, eos_token_id=eot, pad_token_id=eot,
                         do_sample=False).save_pretrained(out_dir)
        write_tokenizer_files(args.data, out_dir, eot, args.max_pos)
        log(f"saved {len(tensors)} tensors ({layout}) to {out_dir}")
        return tensors

    def reload_and_compare():
        """Reload the saved files in float32; the weights must equal the trained
        weights rounded to bf16."""
        r = load_saved(out_dir, device)
        r_sd = r.state_dict()
        diff = 0.0
        for k, v in model.state_dict().items():
            if k not in r_sd:
                raise ValueError(f"reloaded model lacks {k}")
            diff = max(diff, float((r_sd[k].float() - v.to(torch.bfloat16).float()).abs().max()))
        log(f"reloaded: max |weight difference| vs trained bf16 = {diff}")
        if diff != 0.0:
            raise ValueError(f"reloaded weights differ by up to {diff}")
        return r

    ref, tensors, layout = None, None, None
    for layout in ("hf-per-expert", "transformers-native"):
        try:
            tensors = save(layout)
            ref = reload_and_compare()
            break
        except Exception as e:
            log(f"layout '{layout}' failed: {type(e).__name__}: {str(e)[:300]}")
    if ref is None:
        raise SystemExit("could not save weights that reload exactly")
    ref_impl = get_experts_impl(ref)

    counts = [np.zeros(args.experts, dtype=np.int64) for _ in range(args.layers)]
    nll, cnt = eval_nll(ref, ref_wins, 32, autocast=False, expert_counts=counts)
    valid_ppl = math.exp(nll / cnt)
    all_wins = windows(valid, args.ref_ctx, valid.numel())
    nll_all, cnt_all = eval_nll(ref, all_wins, 32, autocast=False)
    sel_nll, sel_cnt = eval_nll(ref, sel_wins, 32, autocast=False)
    log(f"valid ppl (float32, reference slice, {ref_wins.size(0)} x {args.ref_ctx}) = {valid_ppl:.4f}; "
        f"all valid windows: {math.exp(nll_all / cnt_all):.4f}")

    gens = []
    with torch.no_grad():
        for prompt in PROMPTS:
            ids = [eot] + tok.encode(prompt).ids
            cur = list(ids)
            first_top = None
            for i in range(args.gen_tokens):
                logits = ref(input_ids=torch.tensor([cur], device=device), use_cache=False).logits[0, -1].float()
                if i == 0:
                    tv, ti = torch.topk(logits, 10)
                    first_top = [[int(a), round(float(b), 5)] for a, b in zip(ti.tolist(), tv.tolist())]
                cur.append(int(torch.argmax(logits).item()))
            new = cur[len(ids):]
            rec = {"prompt": prompt, "input_ids": ids, "greedy_ids": new,
                   "text": tok.decode(new, skip_special_tokens=False),
                   "first_step_top10": first_top}
            try:  # cross-check with generate() and its KV cache
                inp = torch.tensor([ids], device=device)
                g = ref.generate(inp, attention_mask=torch.ones_like(inp),
                                 max_new_tokens=args.gen_tokens, do_sample=False, num_beams=1)
                gnew = g[0, len(ids):].tolist()
                stop = new.index(eot) + 1 if eot in new else len(new)
                rec["generate_agrees"] = gnew[:stop] == new[:stop]
            except Exception as e:
                rec["generate_agrees"] = f"not checked: {type(e).__name__}"
            gens.append(rec)
            log(f"{prompt!r} -> {rec['text']!r} (generate agrees: {rec['generate_agrees']})")

    try:
        from transformers import AutoTokenizer
        at = AutoTokenizer.from_pretrained(out_dir)
        hf_tok_ok = all(at(p, add_special_tokens=False)["input_ids"] == tok.encode(p).ids for p in PROMPTS)
    except Exception as e:
        hf_tok_ok = f"not loadable: {type(e).__name__}: {str(e)[:200]}"
    log(f"AutoTokenizer agrees with tokenizers: {hf_tok_ok}")

    files = {}
    for name in sorted(os.listdir(out_dir)):
        p = os.path.join(out_dir, name)
        if os.path.isfile(p) and name != "reference.json":
            files[name] = {"bytes": os.path.getsize(p), "sha256": sha256(p)}
    reference = {
        "model": {
            "architecture": "Qwen3MoeForCausalLM (model_type qwen3_moe)",
            "parameters_total": n_params,
            "parameters_active_per_token": exp["active_per_token"],
            "parameter_breakdown": exp,
            "weights_dtype": "bfloat16",
            "weights_layout": layout,
            "tied_embeddings": "lm_head.weight = model.embed_tokens.weight (not stored)",
            "all_layers_sparse": True,
            "tensors": {k: list(v.shape) for k, v in sorted(tensors.items())},
        },
        "tokenizer": {"vocab_size": vocab, "eot_token": EOT, "eot_id": eot,
                      "type": "byte-level BPE (tokenizers), no normalizer, nothing added on encode",
                      "autotokenizer_agrees": hf_tok_ok},
        "data": {
            "description": "public-domain English text from Debian 12 packages: King James Bible, "
                           "World English Bible, Matthew Henry's Concise Commentary, Spurgeon's "
                           "Treasury of David, Jane Austen's six novels, Bierce's Devil's Dictionary, "
                           "the Jargon File 4.4.7; documents split train/valid by a hash of their key "
                           "(tools/train/extract_corpus.py)",
            "train_tokens": int(train.numel()),
            "valid_tokens": int(valid.numel()),
            "train_bin_sha256": sha256(os.path.join(args.data, "train.bin")),
            "valid_bin_sha256": sha256(os.path.join(args.data, "valid.bin")),
            "meta": meta,
        },
        "training": {
            "steps": step,
            "kept_step": best["step"],
            "tokens_per_step": tokens_per_step,
            "tokens_seen": step * tokens_per_step,
            "epochs": round(step * tokens_per_step / train.numel(), 3),
            "train_seconds": round(train_seconds, 1),
            "experts_implementation": impl,
            "experts_timings_ms": {k: round(v * 1000, 2) for k, v in timings.items()},
            "history": history,
            "args": vars(args),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "gpu": torch.cuda.get_device_name(0),
            "python": platform.python_version(),
            "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        },
        "eval": {
            "valid_ppl": round(valid_ppl, 4),
            "valid_nll_mean": round(nll / cnt, 6),
            "method": (f"float32 forward of the saved bf16 weights (transformers, experts "
                       f"'{ref_impl}', TF32 off); windows i = 0..{ref_wins.size(0) - 1} are "
                       f"valid.bin tokens [i*{args.ref_ctx}, (i+1)*{args.ref_ctx}), each one "
                       f"forward pass from position 0 with no BOS added; the {args.ref_ctx - 1} "
                       f"next-token predictions of positions 1..{args.ref_ctx - 1} of every window "
                       f"are scored ({cnt} in all); ppl = exp(mean natural-log NLL)"),
            "ctx": args.ref_ctx,
            "windows": int(ref_wins.size(0)),
            "scored_tokens": cnt,
            "valid_ppl_all_windows": round(math.exp(nll_all / cnt_all), 4),
            "all_windows": int(all_wins.size(0)),
            "select_slice_ppl": round(math.exp(sel_nll / sel_cnt), 4),
            "select_slice": f"the last {sel_wins.size(0)} windows of {args.ref_ctx} tokens of valid.bin "
                            "(used to pick the kept step)",
            "expert_load_reference_slice": [
                [round(float(c) / max(1, int(layer.sum())), 4) for c in layer] for layer in counts],
        },
        "generation": {
            "method": (f"greedy argmax, float32, full forward per token (no cache), exactly "
                       f"{args.gen_tokens} new tokens; input_ids = [{eot}] + encode(prompt)"),
            "prompts": gens,
        },
        "files": files,
    }
    with open(os.path.join(out_dir, "reference.json"), "w") as f:
        json.dump(reference, f, indent=2)
        f.write("\n")
    write_readme(out_dir, reference)
    log(f"done: valid ppl {valid_ppl:.3f}; outputs in {out_dir}")
    return 0


def write_readme(out_dir: str, ref: dict) -> None:
    m, e, t = ref["model"], ref["eval"], ref["training"]
    a = t["args"]
    lines = [
        "# strata-demo",
        "",
        "A small mixture-of-experts language model trained from scratch for Strata's demo and",
        "as a quality yardstick. Architecture `qwen3_moe` (transformers' `Qwen3MoeForCausalLM`).",
        "Made by `tools/train/train.py`; data and exact commands: `tools/train/README.md`.",
        "",
        f"- parameters: {m['parameters_total']:,} in all, {m['parameters_active_per_token']:,} active per token",
        f"- {a['layers']} layers, hidden {a['hidden']}, {a['heads']} query heads / {a['kv_heads']} KV heads "
        f"of {a['head_dim']}, {a['experts']} experts per layer, top-{a['top_k']} (normalised), "
        f"expert FFN {a['moe_inter']}, RoPE theta {a['rope_theta']:g}, tied embeddings",
        f"- vocabulary: {ref['tokenizer']['vocab_size']} byte-level BPE tokens, "
        f"`<|endoftext|>` = {ref['tokenizer']['eot_id']} (BOS and EOS)",
        f"- trained on {ref['data']['train_tokens']:,} tokens of public-domain English for "
        f"{t['epochs']} epochs ({t['steps']} steps, {t['train_seconds']} s on one {t['gpu']})",
        f"- validation perplexity (float32, {e['windows']} windows of {e['ctx']} tokens): {e['valid_ppl']}",
        "",
        "`reference.json` has the exact evaluation method, greedy continuations with token ids,",
        "and per-layer expert load, for checking an inference engine against transformers.",
        "",
        "Training text is public domain (see tools/train/README.md); weights are released with the repository.",
        "",
    ]
    with open(os.path.join(out_dir, "README.md"), "w") as f:
        f.write("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
