#!/usr/bin/env python3
"""Tokenize train.txt / valid.txt into flat uint16 token streams.

    python3 tools/train/pretokenize.py --corpus data/corpus

reads CORPUS/train.txt, CORPUS/valid.txt and CORPUS/bin/tokenizer.json and writes

    CORPUS/bin/train.bin, CORPUS/bin/valid.bin
        raw little-endian uint16 token ids, no header: for every document in file
        order, <|endoftext|> (id 0) followed by the document's tokens, and one final
        <|endoftext|> at the end.  np.fromfile(path, dtype=np.uint16) reads it.
    CORPUS/bin/meta.json
        token counts, vocab size, the eot id, sha256 of every file in bin/, and the
        corpus manifest (sources, licenses, split rule).

CORPUS/bin/ is everything the GPU machine needs (train.py reads nothing else).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys

import numpy as np
from tokenizers import Tokenizer

EOT = "<|endoftext|>"


def sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def encode_file(tok: Tokenizer, path: str, eot: int) -> tuple[np.ndarray, int, int]:
    with open(path, encoding="utf-8") as f:
        docs = [d for d in f.read().split("\n" + EOT + "\n") if d.strip()]
    chunks = []
    batch = 256
    for i in range(0, len(docs), batch):
        for enc in tok.encode_batch(docs[i:i + batch], add_special_tokens=False):
            chunks.append(np.array([eot] + enc.ids, dtype=np.uint16))
    chunks.append(np.array([eot], dtype=np.uint16))
    arr = np.concatenate(chunks)
    return arr, len(docs), sum(len(d) for d in docs)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", default="data/corpus")
    args = ap.parse_args()
    bindir = os.path.join(args.corpus, "bin")
    tok_path = os.path.join(bindir, "tokenizer.json")
    tok = Tokenizer.from_file(tok_path)
    eot = tok.token_to_id(EOT)
    vocab = tok.get_vocab_size()
    assert vocab <= 65536, "uint16 token ids need a vocabulary of at most 65536"

    meta = {"format": "raw little-endian uint16 token ids; <|endoftext|> before every "
                      "document and once at the end",
            "vocab_size": vocab, "eot_id": eot, "files": {}}
    for split in ("train", "valid"):
        arr, ndocs, nchars = encode_file(tok, os.path.join(args.corpus, split + ".txt"), eot)
        assert int(arr.max()) < vocab
        out = os.path.join(bindir, split + ".bin")
        arr.astype("<u2").tofile(out)
        meta[split + "_tokens"] = int(arr.size)
        meta[split + "_docs"] = ndocs
        meta[split + "_chars"] = nchars
        print(f"{split}: {ndocs} docs, {nchars / 1e6:.2f} M chars -> {arr.size / 1e6:.3f} M tokens "
              f"({nchars / max(1, arr.size - ndocs - 1):.2f} chars/token), {out}")

        # round trip of the first document
        ids = np.fromfile(out, dtype=np.uint16)
        end = int(np.nonzero(ids[1:] == eot)[0][0]) + 1
        with open(os.path.join(args.corpus, split + ".txt"), encoding="utf-8") as f:
            first = f.read().split("\n" + EOT + "\n")[0]
        assert tok.decode(ids[1:end].tolist()) == first, "round trip failed"

    manifest = os.path.join(args.corpus, "manifest.json")
    if os.path.exists(manifest):
        with open(manifest) as f:
            meta["corpus"] = json.load(f)
    for name in ("tokenizer.json", "train.bin", "valid.bin"):
        p = os.path.join(bindir, name)
        meta["files"][name] = {"bytes": os.path.getsize(p), "sha256": sha256(p)}
    with open(os.path.join(bindir, "meta.json"), "w") as f:
        json.dump(meta, f, indent=2)
        f.write("\n")
    print(f"meta: {os.path.join(bindir, 'meta.json')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
