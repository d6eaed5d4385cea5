#!/usr/bin/env bash
# The Python packages of the HTTP API's end-to-end test (the `openai` client, `prometheus_client`'s
# parser and `jsonschema`, which checks structured outputs), from PyPI into a virtual
# environment: DIR (default build/venv).
# Made from Debian's python3 when there is one, seeing its packages too. Safe to run again.
set -euo pipefail
dir="${1:-$(dirname "$0")/../build/venv}"
python=/usr/bin/python3
[ -x "$python" ] || python=python3
if [ ! -x "$dir/bin/python3" ]; then
  "$python" -m venv --system-site-packages "$dir"
fi
if "$dir/bin/python3" -c "import openai, prometheus_client, jsonschema" 2>/dev/null; then
  echo "setup_python: openai, prometheus_client and jsonschema present in $dir"
  exit 0
fi
"$dir/bin/python3" -m pip install --disable-pip-version-check --quiet openai prometheus_client \
  jsonschema
echo "setup_python: installed openai, prometheus_client and jsonschema into $dir"
