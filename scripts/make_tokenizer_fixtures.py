#!/usr/bin/env python3
"""Make tokenizer fixtures for the strata_tokenizer tests with the Hugging Face `tokenizers` library.

For each style below the script trains a small BPE tokenizer, saves its tokenizer.json under
tests/data/tokenizers/<name>/ and writes expected.json next to it with what `tokenizers` computes:

  gpt2-style       byte-level BPE, ByteLevel(use_regex=true) pre-tokenizer (the GPT-2 regex),
                   merges saved as legacy "a b" strings, <|endoftext|>
  qwen2-style      NFC, Sequence[Split(Qwen2 regex, Isolated), ByteLevel(use_regex=false)],
                   <|endoftext|> <|im_start|> <|im_end|>
  o200k-style      Sequence[Split(gpt-oss/o200k regex), ByteLevel(use_regex=false)],
                   ignore_merges=true, <|startoftext|> <|endoftext|> <|return|>
  llama-style      Sequence[Prepend("▁"), Replace(" ", "▁")] normalizer, no pre-tokenizer, BPE with
                   byte_fallback and fuse_unk, <unk> <s> </s>, decoder
                   Sequence[Replace, ByteFallback, Fuse, Strip], TemplateProcessing adding <s>
  metaspace-style  Metaspace(prepend_scheme="first", split=true) pre-tokenizer and decoder, byte
                   fallback, TemplateProcessing adding <s>
  suffix-style     lowercase + Replace(regex) normalizer, WhitespaceSplit, BPE with
                   continuing_subword_prefix "##" and end_of_word_suffix "</w>", <unk>,
                   BPEDecoder, RobertaProcessing (<s> ... </s>)
  strata-demo      models/strata-demo/tokenizer.json when it exists (copied if under 1 MB)

expected.json holds "cases" (text -> ids of encode(text, add_special_tokens) and decode(ids,
skip_special_tokens=False/True)), "decode_cases" (id lists that encoding never produces, e.g. cut
multi-byte characters, random ids) and "variants": the same tokenizer with some JSON values
replaced (JSON pointer -> value, applied by the C++ test too) to cover other options.

The training text is the Debian license texts (/usr/share/common-licenses), a few Python standard
library modules and the multilingual lines below, so re-running on another machine may give
different (equally valid) fixtures.  Run:  python3 scripts/make_tokenizer_fixtures.py
Needs: pip install tokenizers   (written for tokenizers 0.23)
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import random
import sys
import sysconfig

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers
from tokenizers import pre_tokenizers, processors, trainers

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT_DIR = os.path.join(REPO, "tests", "data", "tokenizers")

QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
                 r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
O200K_PATTERN = "|".join([
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"\p{N}{1,3}",
    r" ?[^\s\p{L}\p{N}]+[\r\n/]*",
    r"\s*[\r\n]+",
    r"\s+(?!\S)",
    r"\s+",
])

MULTILINGUAL = [
    "Le café est très chaud ce matin, et les élèves arrivent à l'école à huit heures.",
    "Où est la bibliothèque ? Je voudrais emprunter un livre français.",
    "Der schnelle braune Fuchs springt über den faulen Hund. Straße, Größe, Äpfel, Öl.",
    "El niño comió una manzana en el jardín. ¿Dónde está la estación? ¡Qué día!",
    "O português é falado no Brasil e em Portugal; ação, coração, não.",
    "Быстрая коричневая лиса прыгает через ленивую собаку. Привет, мир!",
    "Η γρήγορη καφέ αλεπού πηδάει πάνω από τον τεμπέλη σκύλο. Καλημέρα κόσμε.",
    "我们今天学习中文。你好，世界！这是一个测试句子，用来训练分词器。",
    "中文的文本没有空格，所以分词很重要。北京上海广州深圳。",
    "日本語の文章です。ひらがなとカタカナと漢字を使います。東京は大きい都市です。",
    "こんにちは、世界。今日はいい天気ですね。",
    "한국어 문장입니다. 안녕하세요, 세계! 서울은 큰 도시입니다.",
    "Tiếng Việt có nhiều dấu: người, được, những, không.",
    "Türkçe: çalışkan öğrenci, güzel şehir, İstanbul.",
    "Polski: zażółć gęślą jaźń. Čeština: příliš žluťoučký kůň.",
]

# The test strings: every fixture encodes all of them.
LONG_TEXT = (
    "The quick brown fox jumps over the lazy dog. " * 3 +
    "In the beginning was the Word, and the Word was with God.\n\n"
    "def tokenize(text: str) -> list[int]:\n    return [ord(c) for c in text]  # naive\n\n"
    "Numbers like 3.14159, 2.71828 and 1,000,000 appear in text; so do dates (2024-05-17) "
    "and times (12:34:56). Café, naïve, coöperate, résumé. 中文和English混合。" * 4 +
    "\t\tindented\twith\ttabs\n   and   spaces   \n\n\n" * 3)

CASES = [
    "",
    "Hello world",
    "Hello, world! How are you?",
    " leading space",
    "trailing space ",
    "  two leading spaces",
    "multiple   spaces   between   words",
    "tabs\tand\t\ttabs",
    "line one\nline two\n\nline four\n",
    "\n\n\n",
    "   ",
    " ",
    "Windows\r\nline endings\r\n",
    "It's, I'm, we'll, they'd, you've, she's, don't, ISN'T, 'S 'Ll",
    "Numbers: 0 1 12 123 1234 12345 3.14159 -42 1,000,000 2024-05-17",
    "Punctuation!!! ??? ... --- (parens) [brackets] {braces} <angle> @#$%^&*",
    "def foo(x):\n    return x * 2  # comment\n",
    "for (int i = 0; i < n; ++i) {\n\tsum += a[i];\n}",
    "Café crème brûlée, naïve façade, Ångström",
    "Decomposed: Cafe\u0301 e\u0300 n\u0303 A\u030a",
    "Ünïcödé ßtraße Ελληνικά Русский текст",
    "中文文本测试，你好世界。",
    "日本語のテキスト、カタカナとひらがな。",
    "한국어 텍스트입니다",
    "العربية نص",
    "हिन्दी पाठ",
    "Emoji: 😀🎉👍🏽 👨\u200d👩\u200d👧\u200d👦 ❤️",
    "Rare chars: ☃ ☂ ⚡ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𓀀 ꙮ",
    "Mixed 中English文 mixing",
    "<|endoftext|>",
    "Hello<|endoftext|>World",
    "before <|endoftext|> after <|endoftext|><|endoftext|>",
    "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
    "<|startoftext|>Say hi<|return|>",
    "<s>Hello</s>",
    " <s> spaced </s> ",
    "<unk> literal <s",
    "Repeated aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "https://example.com/path?query=1&x=y#frag",
    "email@example.com, user_name123",
    "CamelCaseIdentifier snake_case_identifier SCREAMING_CASE HTTPServer",
    "\u00a0non-breaking\u00a0space and\u3000ideographic space\u2003em",
    "zero\u200bwidth joiner\u200d test\u180evowel\u0085nel",
    "  \u180e two spaces before U+180E, which is not White_Space\u2028line sep",
    "Ｆｕｌｌｗｉｄｔｈ ｃｈａｒｓ ﬁ ligature ①",
    "ſ long s and 'ſ 'K 'K",
    "control\x00chars\x01\x1f\x7f end",
    "hello world hello",
    LONG_TEXT,
]
# Also encoded with add_special_tokens=True.
SPECIAL_CASES = ["", "Hello world", "<s>Hello</s>", "<|endoftext|>", " leading space"]


def training_text() -> list[str]:
    docs = []
    lic_dir = "/usr/share/common-licenses"
    for name in ["GPL-3", "Apache-2.0", "LGPL-2.1", "MPL-2.0", "Artistic", "BSD"]:
        path = os.path.join(lic_dir, name)
        if os.path.exists(path):
            with open(path, encoding="utf-8", errors="replace") as f:
                docs.append(f.read())
    stdlib = sysconfig.get_paths()["stdlib"]
    for name in ["textwrap.py", "json/encoder.py", "json/decoder.py", "string.py", "heapq.py",
                 "bisect.py", "fnmatch.py", "shlex.py"]:
        path = os.path.join(stdlib, name)
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                docs.append(f.read())
    docs.extend(MULTILINGUAL * 4)
    return docs


def byte_level_tokenizer(vocab_size: int, specials: list[str], normalizer, pre_tokenizer,
                         docs: list[str]) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tokenizer
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2,
                                  special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(docs, trainer=trainer, length=len(docs))
    return tok


def make_gpt2(docs):
    tok = byte_level_tokenizer(
        1500, ["<|endoftext|>"], None,
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True), docs)
    data = json.loads(tok.to_str())
    # GPT-2's own tokenizer.json has merges as "a b" strings: keep that format here.
    data["model"]["merges"] = [" ".join(m) for m in data["model"]["merges"]]
    return Tokenizer.from_str(json.dumps(data))


def make_qwen2(docs):
    return byte_level_tokenizer(
        2000, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], normalizers.NFC(),
        pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]), docs)


def make_o200k(docs):
    tok = byte_level_tokenizer(
        1500, ["<|startoftext|>", "<|endoftext|>", "<|return|>"], None,
        pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(O200K_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]), docs)
    data = json.loads(tok.to_str())
    data["model"]["ignore_merges"] = True
    return Tokenizer.from_str(json.dumps(data))


def sentencepiece_model(docs, vocab_size: int):
    """BPE vocabulary laid out like Llama's: <unk> <s> </s>, then <0x00>..<0xFF>, then pieces."""
    base = Tokenizer(models.BPE())
    base.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always",
                                                  split=True)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size - 259, min_frequency=2,
                                  limit_alphabet=150, show_progress=False)
    base.train_from_iterator(docs, trainer=trainer, length=len(docs))
    data = json.loads(base.to_str())
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for piece, _ in sorted(data["model"]["vocab"].items(), key=lambda kv: kv[1]):
        if piece not in vocab:
            vocab[piece] = len(vocab)
    merges = [tuple(m) for m in data["model"]["merges"]]
    return models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", fuse_unk=True,
                      byte_fallback=True)


def sentencepiece_specials(tok: Tokenizer):
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t in ["<unk>", "<s>", "</s>"]])
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 1)])


def make_llama(docs):
    tok = Tokenizer(sentencepiece_model(docs, 1800))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"),
                                           normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                     decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    sentencepiece_specials(tok)
    return tok


def make_metaspace(docs):
    tok = Tokenizer(sentencepiece_model(docs, 1200))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first",
                                                 split=True)
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="first", split=True)
    sentencepiece_specials(tok)
    return tok


def make_suffix(docs):
    tok = Tokenizer(models.BPE(unk_token="<unk>", continuing_subword_prefix="##",
                               end_of_word_suffix="</w>"))
    tok.normalizer = normalizers.Sequence([normalizers.Lowercase(),
                                           normalizers.Replace(Regex(r"[0-9]+"), "#")])
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    trainer = trainers.BpeTrainer(vocab_size=1000, min_frequency=2, limit_alphabet=120,
                                  special_tokens=["<unk>", "<s>", "</s>"],
                                  continuing_subword_prefix="##", end_of_word_suffix="</w>",
                                  show_progress=False)
    tok.train_from_iterator(docs, trainer=trainer, length=len(docs))
    tok.decoder = decoders.BPEDecoder(suffix="</w>")
    tok.post_processor = processors.RobertaProcessing(("</s>", tok.token_to_id("</s>")),
                                                      ("<s>", tok.token_to_id("<s>")))
    return tok


def added(content, id_, special, normalized=None, lstrip=False, rstrip=False, single_word=False):
    return {"id": id_, "content": content, "single_word": single_word, "lstrip": lstrip,
            "rstrip": rstrip, "normalized": (not special) if normalized is None else normalized,
            "special": special}


def variants_for(name: str, data: dict) -> list[dict]:
    n = len(data["model"]["vocab"])
    base_added = data["added_tokens"]
    ids = {t["content"]: t["id"] for t in base_added}
    if name == "gpt2-style":
        return [
            {"name": "add_prefix_space", "set": {"/pre_tokenizer/add_prefix_space": True}},
            {"name": "added_token_flags", "set": {"/added_tokens": base_added + [
                added("<|user|>", n, False, normalized=False, lstrip=True, rstrip=True),
                added("hello", n + 1, False, single_word=True),
                added("[MASK]", n + 2, True, lstrip=True),
                added(" world", n + 3, False),
                added("</s>", n + 4, True, rstrip=True),
            ]}},
            {"name": "no_decoder", "set": {"/decoder": None}},
            {"name": "whitespace_split", "set": {"/pre_tokenizer": {
                "type": "Sequence", "pretokenizers": [
                    {"type": "WhitespaceSplit"},
                    {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                     "use_regex": False}]}}},
            {"name": "roberta_post_processor", "set": {"/post_processor": {
                "type": "RobertaProcessing", "sep": ["<|endoftext|>", ids["<|endoftext|>"]],
                "cls": ["<|endoftext|>", ids["<|endoftext|>"]], "trim_offsets": True,
                "add_prefix_space": False}}},
        ]
    if name == "qwen2-style":
        split = "/pre_tokenizer/pretokenizers/0"
        return [
            {"name": "merged_with_previous", "set": {split + "/behavior": "MergedWithPrevious"}},
            {"name": "merged_with_next", "set": {split + "/behavior": "MergedWithNext"}},
            {"name": "contiguous", "set": {split + "/behavior": "Contiguous"}},
            {"name": "removed", "set": {split + "/behavior": "Removed"}},
            {"name": "inverted", "set": {split + "/invert": True}},
            {"name": "nfkc", "set": {"/normalizer": {"type": "NFKC"}}},
            # Oniguruma's \w (letters, marks, Nd, Pc), \h (hex digit) and ^/$ (line anchors).
            {"name": "onig_classes", "set": {split + "/pattern": {
                "Regex": r"^\h+|\w+$|\w+|[^\s\w]+|\s+"}}},
            {"name": "nfd_lowercase_strip", "set": {"/normalizer": {
                "type": "Sequence", "normalizers": [
                    {"type": "NFD"}, {"type": "StripAccents"}, {"type": "Lowercase"},
                    {"type": "Strip", "strip_left": True, "strip_right": True}]}}},
            {"name": "string_split_and_prefix_space", "set": {
                split: {"type": "Split", "pattern": {"String": " "}, "behavior": "MergedWithNext",
                        "invert": False},
                "/pre_tokenizer/pretokenizers/1/add_prefix_space": True}},
            {"name": "template_im_start", "set": {"/post_processor": {
                "type": "TemplateProcessing",
                "single": [{"SpecialToken": {"id": "<|im_start|>", "type_id": 0}},
                           {"Sequence": {"id": "A", "type_id": 0}},
                           {"SpecialToken": {"id": "<|im_end|>", "type_id": 0}}],
                "pair": [{"Sequence": {"id": "A", "type_id": 0}},
                         {"Sequence": {"id": "B", "type_id": 1}}],
                "special_tokens": {
                    "<|im_start|>": {"id": "<|im_start|>", "ids": [ids["<|im_start|>"]],
                                     "tokens": ["<|im_start|>"]},
                    "<|im_end|>": {"id": "<|im_end|>", "ids": [ids["<|im_end|>"]],
                                   "tokens": ["<|im_end|>"]},
                }}}},
        ]
    if name == "o200k-style":
        return [
            {"name": "no_ignore_merges", "set": {"/model/ignore_merges": False}},
            {"name": "digits_bytelevel_regex", "set": {"/pre_tokenizer": {
                "type": "Sequence", "pretokenizers": [
                    {"type": "Digits", "individual_digits": True},
                    {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                     "use_regex": True}]}}},
            {"name": "sequence_post_processor", "set": {"/post_processor": {
                "type": "Sequence", "processors": [
                    {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                     "use_regex": False},
                    {"type": "TemplateProcessing",
                     "single": [{"SpecialToken": {"id": "<|startoftext|>", "type_id": 0}},
                                {"Sequence": {"id": "A", "type_id": 0}},
                                {"SpecialToken": {"id": "<|return|>", "type_id": 0}}],
                     "pair": [{"Sequence": {"id": "A", "type_id": 0}},
                              {"Sequence": {"id": "B", "type_id": 1}}],
                     "special_tokens": {
                         "<|startoftext|>": {"id": "<|startoftext|>",
                                             "ids": [ids["<|startoftext|>"]],
                                             "tokens": ["<|startoftext|>"]},
                         "<|return|>": {"id": "<|return|>", "ids": [ids["<|return|>"]],
                                        "tokens": ["<|return|>"]}}}]}}},
        ]
    if name == "llama-style":
        return [
            {"name": "no_byte_fallback", "set": {"/model/byte_fallback": False}},
            {"name": "no_byte_fallback_no_fuse", "set": {"/model/byte_fallback": False,
                                                         "/model/fuse_unk": False}},
            {"name": "added_token_flags", "set": {"/added_tokens": [
                added("<unk>", 0, True, normalized=False),
                added("<s>", 1, True, normalized=False, rstrip=True),
                added("</s>", 2, True, normalized=False, lstrip=True),
                added("<|endoftext|>", n, False, normalized=True),
                added("hello", n + 1, False, normalized=True, single_word=True),
            ]}},
            {"name": "bos_eos_template", "set": {"/post_processor": {
                "type": "TemplateProcessing",
                "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                           {"Sequence": {"id": "A", "type_id": 0}},
                           {"SpecialToken": {"id": "</s>", "type_id": 0}}],
                "pair": [{"Sequence": {"id": "A", "type_id": 0}},
                         {"Sequence": {"id": "B", "type_id": 1}}],
                "special_tokens": {
                    "<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]},
                    "</s>": {"id": "</s>", "ids": [2], "tokens": ["</s>"]},
                }}}},
        ]
    if name == "suffix-style":
        return [
            {"name": "no_unk", "set": {"/model/unk_token": None}},
            {"name": "bert_post_processor", "set": {"/post_processor": {
                "type": "BertProcessing", "sep": ["</s>", ids.get("</s>", 2)],
                "cls": ["<s>", ids.get("<s>", 1)]}}},
        ]
    if name == "metaspace-style":
        return [
            {"name": "prepend_always", "set": {"/pre_tokenizer/prepend_scheme": "always",
                                               "/decoder/prepend_scheme": "always"}},
            {"name": "prepend_never", "set": {"/pre_tokenizer/prepend_scheme": "never",
                                              "/decoder/prepend_scheme": "never"}},
            {"name": "no_split", "set": {"/pre_tokenizer/split": False}},
            {"name": "no_fuse_unk", "set": {"/model/fuse_unk": False,
                                            "/model/byte_fallback": False}},
        ]
    return []


def set_pointer(data: dict, pointer: str, value) -> None:
    parts = [p.replace("~1", "/").replace("~0", "~") for p in pointer.split("/")[1:]]
    node = data
    for p in parts[:-1]:
        node = node[int(p)] if isinstance(node, list) else node[p]
    last = parts[-1]
    if isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value


def expectations(tok: Tokenizer, seed: int, variant: bool = False) -> dict:
    cases = []
    for text in CASES:
        if variant and text == LONG_TEXT:
            continue
        for add_special in ([False, True] if text in SPECIAL_CASES else [False]):
            ids = tok.encode(text, add_special_tokens=add_special).ids
            cases.append({
                "text": text,
                "add_special_tokens": add_special,
                "ids": ids,
                "decoded": tok.decode(ids, skip_special_tokens=False),
                "decoded_skip_special": tok.decode(ids, skip_special_tokens=True),
            })
    # Id lists that encoding does not produce: cut characters, lone bytes, random ids.
    rng = random.Random(seed)
    vocab_size = tok.get_vocab_size(with_added_tokens=True)
    id_lists = []
    for text in ["Emoji: 😀🎉👍🏽", "中文文本测试", "Rare chars: ☃ 𝔘𝔫𝔦 𓀀", "Café"]:
        ids = tok.encode(text).ids
        id_lists += [ids[:-1], ids[1:], ids[:-1] + ids[-1:] * 2, ids[::-1]]
    for _ in range(12):
        id_lists.append([rng.randrange(vocab_size) for _ in range(rng.randrange(1, 24))])
    if not variant:
        id_lists.append(list(range(min(vocab_size, 300))))
    decode_cases = []
    for ids in id_lists:
        decode_cases.append({
            "ids": ids,
            "decoded": tok.decode(ids, skip_special_tokens=False),
            "decoded_skip_special": tok.decode(ids, skip_special_tokens=True),
        })
    return {"cases": cases, "decode_cases": decode_cases}


def compact_json(value, indent: str = "") -> str:
    """JSON with one line per case: objects and lists of objects are broken, the rest is not."""
    dump = lambda v: json.dumps(v, ensure_ascii=True, separators=(",", ":"))
    inner = indent + " "
    if isinstance(value, dict) and any(isinstance(v, list) and v and isinstance(v[0], dict)
                                       for v in value.values()):
        items = [f"{inner}{dump(k)}: {compact_json(v, inner)}" for k, v in value.items()]
        return "{\n" + ",\n".join(items) + "\n" + indent + "}" + ("" if indent else "\n")
    if isinstance(value, list) and value and isinstance(value[0], dict):
        items = [inner + compact_json(v, inner) for v in value]
        return "[\n" + ",\n".join(items) + "\n" + indent + "]"
    return dump(value)


def write_fixture(name: str, tok: Tokenizer, tokenizer_json: str | None = None) -> None:
    folder = os.path.join(OUT_DIR, name)
    os.makedirs(folder, exist_ok=True)
    text = tokenizer_json if tokenizer_json is not None else tok.to_str(pretty=False)
    with open(os.path.join(folder, "tokenizer.json"), "w", encoding="utf-8") as f:
        f.write(text)
    data = json.loads(text)
    tok = Tokenizer.from_str(text)  # exactly what the C++ test loads
    expected = {"tokenizer": "tokenizer.json", "vocab_size": tok.get_vocab_size(True)}
    expected.update(expectations(tok, seed=len(name)))
    expected["variants"] = []
    for variant in variants_for(name, data):
        patched = copy.deepcopy(data)
        for pointer, value in variant["set"].items():
            set_pointer(patched, pointer, value)
        vtok = Tokenizer.from_str(json.dumps(patched))
        entry = dict(variant)
        entry.update(expectations(vtok, seed=len(variant["name"]), variant=True))
        expected["variants"].append(entry)
    with open(os.path.join(folder, "expected.json"), "w", encoding="utf-8") as f:
        f.write(compact_json(expected))
    size = os.path.getsize(os.path.join(folder, "tokenizer.json"))
    print(f"{name}: vocab {tok.get_vocab_size(True)}, tokenizer.json {size // 1024} KB, "
          f"{len(expected['cases'])} cases, {len(expected['variants'])} variants")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--strata-demo", default=os.path.join(REPO, "models", "strata-demo",
                                                          "tokenizer.json"),
                    help="the demo model's tokenizer.json (skipped when missing)")
    args = ap.parse_args()
    docs = training_text()
    write_fixture("gpt2-style", make_gpt2(docs))
    write_fixture("qwen2-style", make_qwen2(docs))
    write_fixture("o200k-style", make_o200k(docs))
    write_fixture("llama-style", make_llama(docs))
    write_fixture("metaspace-style", make_metaspace(docs))
    write_fixture("suffix-style", make_suffix(docs))
    if os.path.exists(args.strata_demo):
        if os.path.getsize(args.strata_demo) >= 1 << 20:
            print(f"{args.strata_demo} is 1 MB or more: not copied", file=sys.stderr)
        else:
            with open(args.strata_demo, encoding="utf-8") as f:
                text = f.read()
            write_fixture("strata-demo", Tokenizer.from_str(text), tokenizer_json=text)
    else:
        print(f"no {args.strata_demo}: strata-demo fixture skipped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
