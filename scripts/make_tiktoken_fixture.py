#!/usr/bin/env python3
"""Make the tiktoken (Kimi-K2 style) tokenizer fixture for the strata_tokenizer tests.

Writes tests/data/tokenizers/kimi-style/:
  tiktoken.model         the rank table, one "base64(token bytes) rank" line per token: the
                         byte-level vocabulary of the qwen2-style fixture in id order (its added
                         tokens left out), then tokens that span the edges of Kimi's pattern
                         (such as "界。"), then runs of "a", " ", "\\n" and "中" of 1 to 1024
                         (so that the ids of runs of 25,000 characters stay few)
  tokenizer_config.json  Kimi-K2's layout: added_tokens_decoder with Kimi's special tokens at
                         Kimi's offsets after the ranks (two of them not special), bos_token,
                         eos_token, ...; the other ids of the 256 after the ranks are
                         <|reserved_token_{id}|>
  expected.json          what tiktoken computes, encoding as Kimi's tokenization_kimi.py does:
                         the text cut into pieces of at most 400,000 characters, each cut where a
                         run of whitespace or non-whitespace (str.isspace) would pass 25,000
                         characters, every piece encoded with allowed_special="all" under Kimi's
                         pat_str; decode is tiktoken's (UTF-8 with replacement), and with
                         skip_special_tokens the ids of tokens marked special are left out first.

Cases of long texts give "text_parts" ([piece, count] pairs, concatenated) instead of "text" and
leave out the decoded text, which is the text itself.

Run:  python3 scripts/make_tiktoken_fixture.py      Needs: pip install tiktoken  (0.12 or later)
"""

from __future__ import annotations

import base64
import json
import os
import random
import sys

import tiktoken

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCE = os.path.join(REPO, "tests", "data", "tokenizers", "qwen2-style", "tokenizer.json")
OUT_DIR = os.path.join(REPO, "tests", "data", "tokenizers", "kimi-style")

# Kimi's pat_str (tokenization_kimi.py), in the Rust regex syntax tiktoken compiles.
KIMI_PATTERN = "|".join([
    r"[\p{Han}]+",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*"
    r"[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+"
    r"[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"\p{N}{1,3}",
    r" ?[^\s\p{L}\p{N}]+[\r\n]*",
    r"\s*[\r\n]+",
    r"\s+(?!\S)",
    r"\s+",
])
NUM_SPECIAL = 256
MAX_ENCODE_CHARS = 400_000
MAX_RUN_CHARS = 25_000

# Kimi-K2's named special tokens by offset from the first special id; `False` marks the ones
# added here as not special, to cover skip_special_tokens for both kinds.
SPECIALS = {
    0: ("[BOS]", True), 1: ("[EOS]", True), 2: ("<|im_end|>", True), 3: ("<|im_user|>", True),
    4: ("<|im_assistant|>", True), 6: ("<|start_header_id|>", True),
    7: ("<|end_header_id|>", True), 9: ("[EOT]", True), 10: ("<|im_system|>", True),
    11: ("<|tool_calls_section_begin|>", True), 12: ("<|tool_calls_section_end|>", True),
    13: ("<|tool_call_begin|>", True), 14: ("<|tool_call_argument_begin|>", True),
    15: ("<|tool_call_end|>", True), 17: ("<|im_middle|>", True), 22: ("<think>", False),
    23: ("</think>", False), 254: ("[UNK]", True), 255: ("[PAD]", True),
}

CROSS_TOKENS = ["界。", "文、", "漢\u302a", "\u302a字", " 中", "h文", "文a", "々a", "a々", "ー々"]

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
    "  \n  \t\n x\r\r\n\n  y   ",
    "It's, I'm, we'll, they'd, you've, she's, don't, ISN'T, 'S 'Ll 'VE",
    "CamelCaseIdentifier snake_case_identifier SCREAMING_CASE HTTPServer McDonald'S",
    "ſ long s and 'ſ 'K 'K",
    "Numbers: 0 1 12 123 1234 12345 1234567 3.14159 -42 1,000,000 2024-05-17 ٣٤٥٦ ⅢⅣ ½",
    "Punctuation!!! ??? ... --- (parens) [brackets] {braces} <angle> @#$%^&*",
    "!!!\n\n??\r\n",
    "def foo(x):\n    return x * 2  # comment\n",
    "for (int i = 0; i < n; ++i) {\n\tsum += a[i];\n}",
    "{\"key\": [1, 2, 3], \"nested\": {\"a\": null}}",
    "Café crème brûlée, naïve façade, Ångström",
    "Decomposed: Cafe\u0301 e\u0300 n\u0303 A\u030a",
    "Ünïcödé ßtraße Ελληνικά Русский текст",
    "中文文本测试，你好世界。",
    "我们今天学习中文。你好，世界！这是一个测试句子。",
    "日本語のテキスト、カタカナとひらがな。東京は大きい都市です。",
    "ラーメン・コーヒー\u3000々〆〇 時々 漢\u302a字 〻",
    "Han and not: 㐀 𠀀 丽 ⺀ ⿰ ㆒ 〡 〸 ㄅ 中ー文",
    "中文、漢\u302a字、世界。時々a ー々 a々 文a",
    "Mixed 中English文 mixing 中文and English混合。",
    "한국어 텍스트입니다",
    "العربية نص",
    "हिन्दी पाठ",
    "Emoji: 😀🎉👍🏽 👨\u200d👩\u200d👧\u200d👦 ❤️",
    "Rare chars: ☃ ☂ ⚡ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𓀀 ꙮ",
    "\u00a0non-breaking\u00a0space and\u3000ideographic space\u2003em",
    "zero\u200bwidth joiner\u200d test\u180evowel\u0085nel\u2028line sep",
    "Ｆｕｌｌｗｉｄｔｈ ｃｈａｒｓ ﬁ ligature ①",
    "control\x00chars\x01\x1f\x7f end",
    "https://example.com/path?query=1&x=y#frag email@example.com",
    "Repeated aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "[BOS]",
    "Hello[EOS]World",
    "<|im_user|>user<|im_middle|>Hi there<|im_end|><|im_assistant|>assistant<|im_middle|>",
    "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
    "<|tool_call_argument_begin|>{\"city\": \"北京\"}<|tool_call_end|><|tool_calls_section_end|>",
    "<think>\nreasoning\n</think>\n\nanswer",
    " <|im_end|> spaced <|im_end|>\n",
    "<|im_end|<|im_end|>>",
    "<|reserved_token_{first}|> and <|reserved_token_{last}|> and <|reserved_token_1|>",
    "[UNK][PAD][BOS]text",
]
# Also encoded with add_special_tokens=True (which adds nothing for Kimi).
SPECIAL_CASES = ["", "Hello world", "[BOS]"]
# Long texts, as [piece, count] pairs: runs around the 25,000-character limit (in characters,
# not bytes: "中" is three), and a text whose 400,000-character cut falls inside a run.
LONG_CASES = [
    [["a", 25_000]],
    [["a", 25_001]],
    [["a", 50_001], [" ", 3], ["b", 2]],
    [[" ", 25_001], ["x", 1]],
    [["\n", 24_999], [" ", 2], ["z", 1]],
    [["中", 25_001]],
    [["x", 10], ["中", 30_000], ["y", 10]],
    [["a", 19_999], [" ", 20_000]] * 10 + [["a", 100]],
]


def byte_decoder() -> dict[str, int]:
    """The inverse of GPT-2's bytes_to_unicode."""
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) +
                 list(range(ord("®"), ord("ÿ") + 1)))
    chars = printable[:]
    n = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(printable, chars)}


def make_ranks() -> dict[bytes, int]:
    with open(SOURCE, encoding="utf-8") as f:
        data = json.load(f)
    added = {t["content"] for t in data["added_tokens"]}
    decode = byte_decoder()
    ranks: dict[bytes, int] = {}
    for token, _ in sorted(data["model"]["vocab"].items(), key=lambda kv: kv[1]):
        if token not in added:
            ranks.setdefault(bytes(decode[c] for c in token), len(ranks))
    for b in range(256):
        ranks.setdefault(bytes([b]), len(ranks))
    # Tokens across the edges Kimi's pattern draws (Han and other scripts, letters that are
    # Han), reachable by merges: they change the ids where a pattern draws an edge wrongly.
    for token in CROSS_TOKENS:
        for c in token:
            b = c.encode()
            for end in range(2, len(b) + 1):
                ranks.setdefault(b[:end], len(ranks))
        ranks.setdefault(token.encode(), len(ranks))
    zhong = "中".encode()
    ranks.setdefault(zhong[:2], len(ranks))
    for unit in [b"a", b" ", b"\n", zhong]:
        for k in range(11):
            ranks.setdefault(unit * (1 << k), len(ranks))
    return ranks


def special_tokens(n: int) -> tuple[dict[str, int], set[int]]:
    tokens, skipped = {}, set()
    for i in range(n, n + NUM_SPECIAL):
        content, special = SPECIALS.get(i - n, (f"<|reserved_token_{i}|>", True))
        tokens[content] = i
        if special:
            skipped.add(i)
    return tokens, skipped


def pieces(text: str):
    """The pieces tokenization_kimi.py hands to tiktoken, one at a time."""
    for start in range(0, len(text), MAX_ENCODE_CHARS):
        chunk = text[start:start + MAX_ENCODE_CHARS]
        begin, run, in_space = 0, 0, chunk[:1].isspace()
        for i, c in enumerate(chunk):
            if c.isspace() != in_space:
                in_space, run = c.isspace(), 1
                continue
            run += 1
            if run > MAX_RUN_CHARS:
                yield chunk[begin:i]
                begin, run = i, 1
        yield chunk[begin:]


def encode(enc: tiktoken.Encoding, text: str) -> list[int]:
    ids = []
    for piece in pieces(text):
        ids += enc.encode(piece, allowed_special="all")
    return ids


def decode_both(enc: tiktoken.Encoding, skipped: set[int], ids: list[int]) -> dict:
    return {"decoded": enc.decode(ids),
            "decoded_skip_special": enc.decode([i for i in ids if i not in skipped])}


def compact_json(value, indent: str = "") -> str:
    """JSON with one line per case."""
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


def main() -> int:
    ranks = make_ranks()
    n = len(ranks)
    specials, skipped = special_tokens(n)
    enc = tiktoken.Encoding("kimi-style", pat_str=KIMI_PATTERN, mergeable_ranks=ranks,
                            special_tokens=specials)
    os.makedirs(OUT_DIR, exist_ok=True)
    with open(os.path.join(OUT_DIR, "tiktoken.model"), "w", encoding="ascii") as f:
        for token, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
            f.write(f"{base64.b64encode(token).decode()} {rank}\n")
    decoder = {}
    for offset, (content, special) in sorted(SPECIALS.items()):
        decoder[str(n + offset)] = {"content": content, "lstrip": False, "normalized": False,
                                    "rstrip": False, "single_word": False, "special": special}
    config = {
        "added_tokens_decoder": decoder,
        "additional_special_tokens": ["<|im_end|>", "<|im_user|>", "<|im_assistant|>",
                                      "<|start_header_id|>", "<|end_header_id|>", "[EOT]",
                                      "<|im_system|>", "<|im_middle|>"],
        "auto_map": {"AutoTokenizer": ["tokenization_kimi.TikTokenTokenizer", None]},
        "bos_token": "[BOS]",
        "clean_up_tokenization_spaces": False,
        "eos_token": "[EOS]",
        "extra_special_tokens": {},
        "model_max_length": 1000000000000000019884624838656,
        "pad_token": "[PAD]",
        "tokenizer_class": "TikTokenTokenizer",
        "unk_token": "[UNK]",
    }
    with open(os.path.join(OUT_DIR, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2, ensure_ascii=False)
        f.write("\n")

    cases = []
    for template in CASES:
        text = template.replace("{first}", str(n)).replace("{last}", str(n + NUM_SPECIAL - 1))
        for add_special in ([False, True] if text in SPECIAL_CASES else [False]):
            ids = encode(enc, text)
            cases.append({"text": text, "add_special_tokens": add_special, "ids": ids,
                          **decode_both(enc, skipped, ids)})
    for parts in LONG_CASES:
        text = "".join(piece * count for piece, count in parts)
        ids = encode(enc, text)
        assert enc.decode(ids) == text
        cases.append({"text_parts": parts, "add_special_tokens": False, "ids": ids})
    rng = random.Random(7)
    vocab_size = n + NUM_SPECIAL
    id_lists = []
    for text in ["Emoji: 😀🎉👍🏽", "中文文本测试", "Rare chars: ☃ 𝔘𝔫𝔦 𓀀", "Café"]:
        ids = encode(enc, text)
        id_lists += [ids[:-1], ids[1:], ids[:-1] + ids[-1:] * 2, ids[::-1]]
    raw = [b"\x80", b"\xff", b"\xe4\xb8", b"\xe4\xb8A", b"\xf0\x80\x80", b"\xed\xa0\x80"]
    id_lists += [[ranks[bytes([c])] for c in r] for r in raw]
    for _ in range(12):
        id_lists.append([rng.randrange(vocab_size) for _ in range(rng.randrange(1, 24))])
    id_lists.append([rng.randrange(n, vocab_size) for _ in range(16)])
    id_lists.append(list(range(300)))
    decode_cases = [{"ids": ids, **decode_both(enc, skipped, ids)} for ids in id_lists]
    expected = {"tokenizer": "tiktoken.model", "vocab_size": vocab_size, "cases": cases,
                "decode_cases": decode_cases}
    with open(os.path.join(OUT_DIR, "expected.json"), "w", encoding="utf-8") as f:
        f.write(compact_json(expected))
    total = sum(os.path.getsize(os.path.join(OUT_DIR, name)) for name in os.listdir(OUT_DIR))
    print(f"kimi-style: {n} ranks + {NUM_SPECIAL} special tokens, {len(cases)} cases, "
          f"{len(decode_cases)} decode cases, {total // 1024} KB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
