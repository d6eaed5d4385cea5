#!/usr/bin/env python3
"""Extract and clean the Strata demo training corpus from installed Debian packages.

Every source is public-domain English text shipped by a Debian 12 (bookworm)
package; tools/train/prepare_data.sh installs them.  The output is

    OUT/train.txt, OUT/valid.txt   documents separated by a line "<|endoftext|>"
    OUT/manifest.json              per-source statistics, package versions, split rule
    OUT/licenses/PKG.copyright     the Debian copyright file of every source package

Split rule (deterministic, by document): every document has a split key; it goes to
the validation set when int(sha256(key)[:8], 16) % 1000 < VALID_PER_MILLE.  All
Bible-derived documents (two translations and three commentaries) of the same book
and chapter share one key ("bible:<book>:<chapter>"), so no chapter is in both sets
in any form.  Each set is then shuffled with random.Random(SEED).

The output depends only on the package contents (versions are recorded in the
manifest) and on this script: no randomness other than the fixed seed.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import html
import json
import os
import random
import re
import shutil
import subprocess
import sys
import unicodedata
from collections import OrderedDict

EOT = "<|endoftext|>"
SEED = 1234
VALID_PER_MILLE = 30  # 3 % of the documents (by key) go to valid

# Source packages whose text we use (the programs that read them are listed in
# prepare_data.sh).  The copyright file of each is copied next to the corpus.
SOURCE_PACKAGES = [
    "bible-kjv-text",
    "sword-text-web",
    "sword-comm-mhcc",
    "sword-comm-tdavid",
    "r-cran-janeaustenr",
    "dict-devil",
    "jargon-text",
]
TOOL_PACKAGES = ["bible-kjv", "libsword-utils", "r-base-core"]

# The 66 books in canonical order, named as the SWORD modules name them.
CANON = [
    "Genesis", "Exodus", "Leviticus", "Numbers", "Deuteronomy", "Joshua", "Judges",
    "Ruth", "I Samuel", "II Samuel", "I Kings", "II Kings", "I Chronicles",
    "II Chronicles", "Ezra", "Nehemiah", "Esther", "Job", "Psalms", "Proverbs",
    "Ecclesiastes", "Song of Solomon", "Isaiah", "Jeremiah", "Lamentations", "Ezekiel",
    "Daniel", "Hosea", "Joel", "Amos", "Obadiah", "Jonah", "Micah", "Nahum", "Habakkuk",
    "Zephaniah", "Haggai", "Zechariah", "Malachi", "Matthew", "Mark", "Luke", "John",
    "Acts", "Romans", "I Corinthians", "II Corinthians", "Galatians", "Ephesians",
    "Philippians", "Colossians", "I Thessalonians", "II Thessalonians", "I Timothy",
    "II Timothy", "Titus", "Philemon", "Hebrews", "James", "I Peter", "II Peter",
    "I John", "II John", "III John", "Jude", "Revelation of John",
]


# --------------------------------------------------------------------------- text


_CHAR_MAP = {
    "\u2018": "'", "\u2019": "'", "\u201a": "'", "\u201b": "'", "\u2032": "'",
    "\u201c": '"', "\u201d": '"', "\u201e": '"', "\u201f": '"', "\u2033": '"',
    "\u2026": "...", "\u00a0": " ", "\u2002": " ", "\u2003": " ", "\u2009": " ",
    "\u200a": " ", "\u202f": " ", "\u00ad": "", "\u200b": "", "\u200c": "",
    "\u200d": "", "\ufeff": "", "\t": " ",
}
_CHAR_RE = re.compile("|".join(map(re.escape, _CHAR_MAP)))


def normalize_chars(s: str) -> str:
    """NFC, ASCII quotes and ellipsis, no exotic spaces or control characters."""
    s = unicodedata.normalize("NFC", s)
    s = _CHAR_RE.sub(lambda m: _CHAR_MAP[m.group(0)], s)
    s = "".join(c for c in s if c == "\n" or unicodedata.category(c)[0] != "C")
    return s


def finish_doc(paragraphs: list[str]) -> str:
    """Paragraphs -> document text: single spaces inside, a blank line between."""
    out = []
    for p in paragraphs:
        if re.search("[\u2500-\u257f]", p):
            continue  # box-drawing tables (Jargon File) do not survive reflowing
        lines = [re.sub(r"[ ]{2,}", " ", ln).strip() for ln in normalize_chars(p).split("\n")]
        lines = [ln for ln in lines if ln]
        if lines:
            out.append("\n".join(lines))
    return "\n\n".join(out).strip()


def reflow(text: str) -> list[str]:
    """Plain wrapped text -> paragraphs.  Blocks are separated by blank lines; the
    lines of a block are joined with spaces, except that indented lines (verse,
    quotations set as poetry) keep their own line."""
    paras = []
    for block in re.split(r"\n[ \t]*\n", text.replace("\r", "")):
        lines = [ln for ln in block.split("\n") if ln.strip()]
        if not lines:
            continue
        indented = sum(1 for ln in lines if re.match(r"^ {3,}\S", ln))
        if len(lines) > 1 and indented == len(lines) and not _all_same_indent(lines):
            paras.append("\n".join(ln.strip() for ln in lines))
        elif len(lines) > 1 and indented == len(lines) and _looks_like_verse(lines):
            paras.append("\n".join(ln.strip() for ln in lines))
        else:
            paras.append(" ".join(ln.strip() for ln in lines))
    return paras


def _all_same_indent(lines: list[str]) -> bool:
    ind = {len(ln) - len(ln.lstrip(" ")) for ln in lines}
    return len(ind) == 1


def _looks_like_verse(lines: list[str]) -> bool:
    # short lines that mostly start with a capital letter
    short = sum(1 for ln in lines if len(ln.strip()) < 60)
    caps = sum(1 for ln in lines if ln.strip()[:1].isupper() or ln.strip()[:1] in "\"'(")
    return short >= 0.8 * len(lines) and caps >= 0.8 * len(lines)


# --------------------------------------------------------------------------- OSIS


_TITLE_RE = re.compile(r"<title\b[^>]*>(.*?)</title>", re.S)


def osis_to_text(s: str) -> str:
    """One SWORD (OSIS markup) entry -> plain text, "\\n" at paragraph breaks."""
    s = re.sub(r"<note\b[^>]*/>", " ", s)
    s = re.sub(r"<note\b.*?</note>", " ", s, flags=re.S)
    s = re.sub(r"<rdg\b.*?</rdg>", " ", s, flags=re.S)
    s = _TITLE_RE.sub(lambda m: "\n" + m.group(1) + "\n", s)
    # paragraph / line structure
    s = re.sub(r'<div\b[^>]*type="x-milestone"[^>]*/>', "", s)
    s = re.sub(r"<div\b[^>]*/>", "\n", s)
    s = re.sub(r"</?(?:p|lg|l|lb|list|item|table|row)\b[^>]*>", "\n", s)
    s = re.sub(r'<milestone\b[^>]*type="line"[^>]*/>', "\n", s)
    s = re.sub(r"<[^>]*>", "", s)  # every other tag: keep the text inside
    s = html.unescape(s)
    return s


def tidy_inline(s: str) -> str:
    """Spaces around punctuation left behind by removed notes and tags."""
    s = re.sub(r"[ \t]+", " ", s)
    s = re.sub(r" +([,.;:!?)\]])", r"\1", s)
    s = re.sub(r"([(\[]) +", r"\1", s)
    return s


def run_mod2imp(module: str):
    """Yield (key, body) for each entry that mod2imp exports from a SWORD module."""
    proc = subprocess.Popen(["mod2imp", module], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL)
    key, body = None, []
    assert proc.stdout is not None
    for raw in proc.stdout:
        line = raw.decode("utf-8", errors="replace").rstrip("\n")
        if line.startswith("$$$"):
            if key is not None:
                yield key, "\n".join(body)
            key, body = line[3:].strip(), []
        else:
            body.append(line)
    if key is not None:
        yield key, "\n".join(body)
    if proc.wait() != 0:
        raise RuntimeError(f"mod2imp {module} failed")


_KEY_RE = re.compile(r"^(.+?) (\d+):(\d+)$")


def sword_chapters(module: str, dedupe: bool):
    """Group a SWORD module's entries by (book, chapter) in module order.
    dedupe: commentaries link one entry to many verses; keep its first copy only."""
    entries: list[tuple[str, int, str]] = []
    seen = set()
    for key, body in run_mod2imp(module):
        m = _KEY_RE.match(key)
        if not m or not body.strip():
            continue
        book, chap = m.group(1), int(m.group(2))
        if dedupe:
            h = hashlib.sha1(body.encode("utf-8")).digest()
            if h in seen:
                continue
            seen.add(h)
        entries.append((book, chap, body))
    if dedupe:
        # Some commentary modules (MHCC) return, for each entry, its text followed
        # by the text of the entries after it up to the end of the compressed block.
        # Cut every entry where the next entry's text begins.
        for i in range(len(entries) - 1):
            book, chap, body = entries[i]
            probe = entries[i + 1][2][:200]
            if len(probe) >= 50:
                p = body.find(probe)
                if p > 0:
                    entries[i] = (book, chap, body[:p])
    chapters: "OrderedDict[tuple[str, int], list[str]]" = OrderedDict()
    for book, chap, body in entries:
        chapters.setdefault((book, chap), []).append(body)
    return chapters


def bible_key(book: str, chap: int) -> str:
    return f"bible:{book}:{chap}"


def chapter_title(book: str, chap: int) -> str:
    if book == "Psalms":
        return f"Psalm {chap}" if chap else "Psalms"
    if book == "Revelation of John":
        book = "Revelation"
    return f"{book} {chap}" if chap else book


# --------------------------------------------------------------------------- sources


def src_kjv():
    """King James Version (1611), text of bible-kjv-text via the `bible` program."""
    out = subprocess.run(["bible", "-f", "Gen1:1-Rev22:21"], check=True,
                         capture_output=True).stdout.decode("utf-8")
    docs: "OrderedDict[tuple[str, int], list[str]]" = OrderedDict()
    book_idx, prev_abbr = -1, None
    for line in out.splitlines():
        m = re.match(r"^(\d?[A-Za-z]+)(\d+):(\d+) (.*)$", line)
        if not m:
            continue
        abbr, chap, text = m.group(1), int(m.group(2)), m.group(4)
        if abbr != prev_abbr:
            book_idx, prev_abbr = book_idx + 1, abbr
        docs.setdefault((CANON[book_idx], chap), []).append(text.strip())
    assert book_idx == 65, f"expected 66 books from `bible`, got {book_idx + 1}"
    for (book, chap), verses in docs.items():
        # one verse per line, the way the KJV is usually printed
        body = "\n".join(tidy_inline(v) for v in verses)
        yield (bible_key(book, chap),
               finish_doc([chapter_title(book, chap), body]))


def _sword_docs(module: str, dedupe: bool, heading: str):
    for (book, chap), entries in sword_chapters(module, dedupe).items():
        text = " ".join(osis_to_text(e) for e in entries)
        paras = [tidy_inline(p).strip() for p in text.split("\n")]
        paras = [p for p in paras if p]
        if not paras:
            continue
        # drop SWORD importer artefacts
        paras = [p for p in paras if not p.startswith("$Rev")]
        title = chapter_title(book, chap)
        if heading:
            title = f"{heading}: {title}"
        doc = finish_doc([title] + paras)
        if len(doc) > len(title) + 20:
            yield bible_key(book, chap), doc


def src_web():
    """World English Bible (public domain), SWORD module engWEB2015eb."""
    yield from _sword_docs("engWEB2015eb", dedupe=False, heading="")


def src_mhcc():
    """Matthew Henry's Concise Commentary (public domain), SWORD module MHCC."""
    yield from _sword_docs("MHCC", dedupe=True,
                           heading="Matthew Henry's Concise Commentary")


def src_tdavid():
    """C. H. Spurgeon, The Treasury of David (1869-1885), SWORD module TDavid."""
    yield from _sword_docs("TDavid", dedupe=True, heading="The Treasury of David")


AUSTEN = [
    ("sensesensibility", "Sense and Sensibility"),
    ("prideprejudice", "Pride and Prejudice"),
    ("mansfieldpark", "Mansfield Park"),
    ("emma", "Emma"),
    ("northangerabbey", "Northanger Abbey"),
    ("persuasion", "Persuasion"),
]


def src_austen(tmpdir: str):
    """Jane Austen's six novels (public domain), data of r-cran-janeaustenr."""
    names = ",".join(f'"{n}"' for n, _ in AUSTEN)
    script = (f"library(janeaustenr); for (n in c({names})) "
              f"writeLines(get(n), file.path(\"{tmpdir}\", paste0(n, \".txt\")), useBytes=TRUE)")
    subprocess.run(["Rscript", "-e", script], check=True, capture_output=True)
    chap_re = re.compile(r"^\s*(CHAPTER|Chapter) ([0-9]+|[IVXLC]+)\.?\s*$")
    for name, title in AUSTEN:
        with open(os.path.join(tmpdir, name + ".txt"), encoding="utf-8") as f:
            lines = f.read().splitlines()
        chapters: list[tuple[str, list[str]]] = []
        for ln in lines:
            s = ln.strip()
            if s == "A NOTE ON THE TEXT":  # modern editor's note (Northanger Abbey)
                break
            if chap_re.match(ln):
                chapters.append((s.title(), []))
                continue
            if not chapters:
                continue  # title page, advertisement
            if re.match(r"^(VOLUME [IVX]+|THE END|FINIS|Finis)$", s):
                continue
            if re.fullmatch(r"[* ]+", s):
                chapters[-1][1].append("")
                continue
            chapters[-1][1].append(ln)
        assert len(chapters) > 20, (name, len(chapters))
        for i, (head, body) in enumerate(chapters):
            text = "\n".join(body)
            text = re.sub(r"_([^_]+)_", r"\1", text)  # _emphasis_
            paras = reflow(text)
            doc = finish_doc([f"{title}, by Jane Austen", head] + paras)
            yield f"austen:{name}:{i}", doc


_B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"


def _b64num(s: str) -> int:
    v = 0
    for c in s:
        v = v * 64 + _B64.index(c)
    return v


def src_devil():
    """Ambrose Bierce, The Devil's Dictionary (1911), dictd data of dict-devil."""
    data = gzip.open("/usr/share/dictd/devil.dict.dz").read()
    seen = set()
    entries: "OrderedDict[str, list[str]]" = OrderedDict()
    with open("/usr/share/dictd/devil.index", encoding="utf-8") as f:
        rows = [ln.split("\t") for ln in f.read().splitlines() if ln]
    rows.sort(key=lambda r: _b64num(r[1]))
    for head, off, ln in rows:
        if head.startswith("00database") or head.startswith("00-database"):
            continue
        off, ln = _b64num(off), _b64num(ln)
        text = data[off:off + ln].decode("utf-8", errors="replace")
        if off in seen or text in seen:
            continue
        seen.update((off, text))
        text = re.sub(r"_([^_]+)_", r"\1", text)
        letter = text.strip()[:1].upper()
        if not letter.isalpha():
            continue
        entries.setdefault(letter, []).append(text)
    for letter, texts in entries.items():
        # documents of about 20 entries each, so the split is not one letter
        chunk = 20
        for j in range(0, len(texts), chunk):
            part = []
            for t in texts[j:j + chunk]:
                part.extend(reflow(t))
            yield (f"devil:{letter}:{j // chunk}",
                   finish_doc([f"The Devil's Dictionary, by Ambrose Bierce: {letter}"] + part))


def src_jargon():
    """The Jargon File 4.4.7 (public domain), text of jargon-text."""
    with gzip.open("/usr/share/doc/jargon-text/jargon.txt.gz", "rt", encoding="utf-8") as f:
        lines = f.read().replace("\u00a0", " ").split("\n")
    # Front matter chapters: from "Chapter 1." up to the glossary index.
    start = next(i for i, ln in enumerate(lines) if ln.startswith("Chapter 1. "))
    gloss = next(i for i, ln in enumerate(lines) if ln == "Glossary")
    appx = next(i for i, ln in enumerate(lines) if ln.startswith("Appendix A. "))
    bib = next(i for i, ln in enumerate(lines) if ln.startswith("Bibliography"))

    def sections(seg: list[str]):
        """Split at unindented heading lines; skip "Table of Contents" lists."""
        cur_head, cur, skipping = None, [], False
        for ln in seg:
            if ln and not ln.startswith(" "):
                if cur_head is not None:
                    yield cur_head, "\n".join(cur)
                cur_head, cur, skipping = ln.strip(), [], False
                continue
            if ln.strip() == "Table of Contents":
                skipping = True
                continue
            if not skipping:
                cur.append(ln)
        if cur_head is not None:
            yield cur_head, "\n".join(cur)

    def clean(t: str) -> str:
        t = re.sub(r"\{([^{}]*)\}", r"\1", t)  # {cross-reference}
        return t

    n = 0
    for head, body in sections(lines[start:gloss]):
        paras = reflow(clean(body))
        if paras:
            yield f"jargon:front:{n}", finish_doc([f"The Jargon File: {head}"] + paras)
            n += 1
    # Glossary entries ":headword: pronunciation, part of speech" + definition.
    entry_re = re.compile(r"^   :(.+?):\s*(.*)$")
    entries: list[tuple[str, list[str]]] = []
    in_entry = False
    for ln in lines[gloss:appx]:
        m = entry_re.match(ln)
        if m:
            entries.append((m.group(1), [m.group(2)]))
            in_entry = True
        elif re.match(r"^  \S", ln):
            in_entry = False  # a letter heading, followed by an index of headwords
        elif in_entry:
            entries[-1][1].append(ln)
    chunk = 25
    for j in range(0, len(entries), chunk):
        paras = []
        for head, body in entries[j:j + chunk]:
            first, rest = body[0].strip(), "\n".join(body[1:])
            paras.append(f"{head}: {first}".strip().rstrip(":"))
            paras.extend(reflow(clean(rest)))
        yield f"jargon:gloss:{j // chunk}", finish_doc(["The Jargon File"] + paras)
    n = 0
    for head, body in sections(lines[appx:bib]):
        paras = reflow(clean(body))
        if paras:
            yield f"jargon:appendix:{n}", finish_doc([f"The Jargon File: {head}"] + paras)
            n += 1


# --------------------------------------------------------------------------- main


MAX_DOC_CHARS = 32000


def split_long(doc: str, max_chars: int = MAX_DOC_CHARS) -> list[str]:
    """Cut a very long document (e.g. Spurgeon on Psalm 119) at paragraph breaks
    into parts of at most about max_chars; the parts keep the document's split key."""
    if len(doc) <= max_chars:
        return [doc]
    parts, cur, n = [], [], 0
    for para in doc.split("\n\n"):
        if cur and n + len(para) > max_chars:
            parts.append("\n\n".join(cur))
            cur, n = [], 0
        cur.append(para)
        n += len(para) + 2
    if cur:
        parts.append("\n\n".join(cur))
    return parts


def is_valid(key: str) -> bool:
    return int(hashlib.sha256(key.encode("utf-8")).hexdigest()[:8], 16) % 1000 < VALID_PER_MILLE


def pkg_version(pkg: str) -> str:
    try:
        return subprocess.run(["dpkg-query", "-W", "-f=${Version}", pkg], check=True,
                              capture_output=True, text=True).stdout.strip()
    except Exception:
        return "unknown"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="data/corpus")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    tmpdir = os.path.join(args.out, "tmp")
    os.makedirs(tmpdir, exist_ok=True)

    sources = [
        ("kjv", "King James Version of the Bible (1611)", "bible-kjv-text", src_kjv),
        ("web", "World English Bible", "sword-text-web", src_web),
        ("mhcc", "Matthew Henry's Concise Commentary on the Whole Bible", "sword-comm-mhcc", src_mhcc),
        ("tdavid", "C. H. Spurgeon, The Treasury of David", "sword-comm-tdavid", src_tdavid),
        ("austen", "Jane Austen, six novels", "r-cran-janeaustenr", lambda: src_austen(tmpdir)),
        ("devil", "Ambrose Bierce, The Devil's Dictionary", "dict-devil", src_devil),
        ("jargon", "The Jargon File 4.4.7", "jargon-text", src_jargon),
    ]
    train, valid, stats = [], [], OrderedDict()
    for name, desc, pkg, fn in sources:
        st = {"description": desc, "package": pkg, "package_version": pkg_version(pkg),
              "docs_train": 0, "docs_valid": 0, "chars_train": 0, "chars_valid": 0}
        for key, whole in fn():
            if not whole or EOT in whole:
                continue
            for doc in split_long(whole):
                if is_valid(key):
                    valid.append(doc)
                    st["docs_valid"] += 1
                    st["chars_valid"] += len(doc)
                else:
                    train.append(doc)
                    st["docs_train"] += 1
                    st["chars_train"] += len(doc)
        stats[name] = st
        print(f"{name:9s} train {st['docs_train']:5d} docs {st['chars_train'] / 1e6:7.2f} MB chars"
              f" | valid {st['docs_valid']:4d} docs {st['chars_valid'] / 1e6:6.2f} MB chars",
              flush=True)
    shutil.rmtree(tmpdir, ignore_errors=True)

    random.Random(SEED).shuffle(train)
    random.Random(SEED + 1).shuffle(valid)
    for fname, docs in (("train.txt", train), ("valid.txt", valid)):
        with open(os.path.join(args.out, fname), "w", encoding="utf-8", newline="\n") as f:
            for d in docs:
                f.write(d)
                f.write("\n" + EOT + "\n")

    lic = os.path.join(args.out, "licenses")
    os.makedirs(lic, exist_ok=True)
    for pkg in SOURCE_PACKAGES:
        src = f"/usr/share/doc/{pkg}/copyright"
        if os.path.exists(src):
            shutil.copyfile(src, os.path.join(lic, pkg + ".copyright"))

    manifest = OrderedDict(
        format="UTF-8 documents, each followed by a line '<|endoftext|>'",
        split_rule=(f"valid iff int(sha256(key)[:8],16) % 1000 < {VALID_PER_MILLE}; "
                    "Bible-derived documents keyed by book and chapter"),
        shuffle_seed=SEED,
        docs_train=len(train), docs_valid=len(valid),
        chars_train=sum(map(len, train)), chars_valid=sum(map(len, valid)),
        sources=stats,
        tool_packages={p: pkg_version(p) for p in TOOL_PACKAGES},
    )
    with open(os.path.join(args.out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=2)
        f.write("\n")
    print(f"total: train {len(train)} docs {manifest['chars_train'] / 1e6:.2f} MB chars, "
          f"valid {len(valid)} docs {manifest['chars_valid'] / 1e6:.2f} MB chars")
    return 0


if __name__ == "__main__":
    sys.exit(main())
