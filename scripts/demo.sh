#!/usr/bin/env bash
# Sets up a fresh machine, builds, and generates from a bundled model.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
model=${MODEL:-tests/data/oracles/qwen3_moe_long}
ids=${IDS:-534,477,423,335,476,300,674,63,280,530}
echo "strata generate --model $model --ids $ids --max-new-tokens 16"
build/bin/strata generate --model "$model" --ids "$ids" --max-new-tokens 16
