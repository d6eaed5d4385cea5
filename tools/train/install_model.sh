#!/usr/bin/env bash
# Reassemble the model that tools/train/gpu_run.sh packed, and check it:
#
#   tools/train/install_model.sh FILES_AT_DIR [DEST_PARENT]
#
# FILES_AT_DIR holds strata-demo.tar.part00, part01, ... (the device tool's files_at);
# the model lands in DEST_PARENT/strata-demo (default models/strata-demo), replacing
# what was there.  Every file is checked against the sha256 in its reference.json.
set -euo pipefail
SRC="${1:?usage: install_model.sh FILES_AT_DIR [DEST_PARENT]}"
DEST="${2:-models}"
ls "$SRC"/strata-demo.tar.part* >/dev/null
mkdir -p "$DEST"
rm -rf "$DEST/strata-demo"
cat "$SRC"/strata-demo.tar.part* | tar -C "$DEST" -xf -
python3 - "$DEST/strata-demo" <<'PY'
import hashlib, json, os, sys
d = sys.argv[1]
ref = json.load(open(os.path.join(d, "reference.json")))
bad = 0
for name, info in ref["files"].items():
    p = os.path.join(d, name)
    h = hashlib.sha256(open(p, "rb").read()).hexdigest()
    ok = h == info["sha256"] and os.path.getsize(p) == info["bytes"]
    bad += not ok
    print(f"{'ok ' if ok else 'BAD'} {name} {info['bytes']}")
print(f"valid ppl {ref['eval']['valid_ppl']}")
sys.exit(1 if bad else 0)
PY
du -sh "$DEST/strata-demo"
