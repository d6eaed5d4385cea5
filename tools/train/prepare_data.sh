#!/usr/bin/env bash
# Prepare the Strata demo corpus, tokenizer and token streams (Debian 12, as root).
#
#   tools/train/prepare_data.sh [OUT_DIR] [VOCAB_SIZE]
#
# OUT_DIR (default data/corpus, git-ignored) receives
#   train.txt, valid.txt, manifest.json, licenses/   the cleaned text and its sources
#   bin/tokenizer.json, bin/train.bin, bin/valid.bin, bin/meta.json
# OUT_DIR/bin is all that train.py needs on the GPU machine.
#
# Every step is deterministic: fixed Debian package versions (recorded in
# manifest.json), a hash-based document split and a seeded shuffle.
set -euo pipefail

OUT="${1:-data/corpus}"
VOCAB="${2:-8192}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PY="${PYTHON:-python3}"

# Public-domain English text (see tools/train/README.md for the licenses) and the
# programs that read their formats.
TEXT_PACKAGES=(
  bible-kjv-text        # King James Version (read with `bible` from bible-kjv)
  sword-text-web        # World English Bible (SWORD module, read with mod2imp)
  sword-comm-mhcc       # Matthew Henry's Concise Commentary (SWORD module)
  sword-comm-tdavid     # Spurgeon, The Treasury of David (SWORD module)
  r-cran-janeaustenr    # Jane Austen's six novels (R data, read with Rscript)
  dict-devil            # Bierce, The Devil's Dictionary (dictd data)
  jargon-text           # The Jargon File 4.4.7
)
TOOL_PACKAGES=(bible-kjv libsword-utils r-base-core)

need_install=0
for p in "${TEXT_PACKAGES[@]}" "${TOOL_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || need_install=1
done
if [ "$need_install" = 1 ]; then
  apt-get update
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
    "${TEXT_PACKAGES[@]}" "${TOOL_PACKAGES[@]}"
fi

"$PY" -c 'import numpy, tokenizers' 2>/dev/null || \
  "$PY" -m pip install --quiet "numpy>=1.24" "tokenizers==0.23.3"

mkdir -p "$OUT"
"$PY" "$HERE/extract_corpus.py" --out "$OUT"
"$PY" "$HERE/train_tokenizer.py" --corpus "$OUT" --vocab-size "$VOCAB"
"$PY" "$HERE/pretokenize.py" --corpus "$OUT"

echo
du -sh "$OUT/train.txt" "$OUT/valid.txt" "$OUT/bin"/*
echo "done: carry $OUT/bin to the GPU machine and run tools/train/train.py there"
