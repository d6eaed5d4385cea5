#!/usr/bin/env bash
# On the GPU machine, from the repository root (data/corpus/bin carried there):
#
#   bash tools/train/gpu_run.sh "$OUT" [extra train.py arguments]
#
# trains into /tmp/strata-demo, then leaves in OUT_DIR what the device tool can bring
# back (at most 8 files of at most 16 MiB): train.log, reference.json and the model
# directory as a tar split into 15 MiB parts (strata-demo.tar.partNN).  Put the model
# in place here with: tools/train/install_model.sh FILES_AT_DIR
set -euo pipefail
OUTDIR="${1:?usage: gpu_run.sh OUT_DIR [train.py args...]}"
shift
export PYTHONUNBUFFERED=1
MODEL_PARENT=/tmp/strata-train
rm -rf "$MODEL_PARENT"
mkdir -p "$MODEL_PARENT" "$OUTDIR"
python3 tools/train/train.py --data data/corpus/bin --out "$MODEL_PARENT/strata-demo" "$@" \
  2>&1 | tee "$OUTDIR/train.log"
cp "$MODEL_PARENT/strata-demo/reference.json" "$OUTDIR/reference.json"
tar -C "$MODEL_PARENT" -cf - strata-demo | split -b 15m -d -a 2 - "$OUTDIR/strata-demo.tar.part"
ls -la "$OUTDIR" "$MODEL_PARENT/strata-demo"
