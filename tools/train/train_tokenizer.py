#!/usr/bin/env python3
"""Train the Strata demo byte-level BPE tokenizer on the training split.

GPT-2/Qwen style: ByteLevel pre-tokenizer (GPT-2 split regex, no prefix space),
BPE model over the 256 byte symbols, ByteLevel decoder, no normalizer.  The only
special token is <|endoftext|> (id 0): it separates documents and serves as both
BOS and EOS.  Nothing is added around an encoded text automatically.

    python3 tools/train/train_tokenizer.py --corpus data/corpus --vocab-size 8192

writes CORPUS/bin/tokenizer.json.  Only train.txt is read, so the validation text
stays unseen.  The result is deterministic for a given train.txt.
"""

from __future__ import annotations

import argparse
import os
import sys

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

EOT = "<|endoftext|>"


def read_docs(path: str) -> list[str]:
    with open(path, encoding="utf-8") as f:
        text = f.read()
    docs = text.split("\n" + EOT + "\n")
    return [d for d in docs if d.strip()]


def build(vocab_size: int, docs: list[str]) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.normalizer = None
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=[EOT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(docs, trainer=trainer, length=len(docs))
    return tok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", default="data/corpus", help="directory with train.txt")
    ap.add_argument("--vocab-size", type=int, default=8192)
    ap.add_argument("--out", default=None, help="default: CORPUS/bin/tokenizer.json")
    args = ap.parse_args()
    out = args.out or os.path.join(args.corpus, "bin", "tokenizer.json")
    os.makedirs(os.path.dirname(out), exist_ok=True)

    docs = read_docs(os.path.join(args.corpus, "train.txt"))
    tok = build(args.vocab_size, docs)
    eot = tok.token_to_id(EOT)
    assert eot == 0, eot
    assert tok.get_vocab_size() == args.vocab_size, tok.get_vocab_size()
    tok.save(out, pretty=True)

    # sanity: lossless round trip, and the special token is matched as one id
    reloaded = Tokenizer.from_file(out)
    sample = "Once upon a time, said Mr. Bennet, \"the LORD's ark\" -- caf\u00e9 \u00e0 la mode.\n\nNext."
    ids = reloaded.encode(sample).ids
    assert reloaded.decode(ids) == sample, reloaded.decode(ids)
    assert reloaded.encode("a" + EOT + "b").ids.count(eot) == 1
    print(f"tokenizer: vocab {reloaded.get_vocab_size()}, <|endoftext|> = {eot}, -> {out}")
    print(f"sample: {len(sample)} chars -> {len(ids)} tokens")
    return 0


if __name__ == "__main__":
    sys.exit(main())
