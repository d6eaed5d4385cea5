#!/usr/bin/env bash
# Generates the Python gRPC stubs of the client API into OUT_DIR, with Debian's tools only
# (protobuf-compiler: protoc; protobuf-compiler-grpc: grpc_python_plugin):
#   OUT_DIR/strata/v1/generation_pb2.py, generation_pb2.pyi, generation_pb2_grpc.py
#   OUT_DIR/grpc_health/v1/health_pb2.py, health_pb2.pyi, health_pb2_grpc.py
#     (from proto/grpc_health/v1/health.proto: Debian's python3-grpcio has no
#     grpc_health package)
# The output needs python3-protobuf (>= 3.20) and python3-grpcio at run time; put OUT_DIR on
# PYTHONPATH (clients/python/strata_client.py also reads STRATA_PYTHON_GENERATED_DIR).
# PROTOC and GRPC_PYTHON_PLUGIN override the tools.
set -euo pipefail

if [ $# -ne 1 ]; then
  echo "usage: $0 OUT_DIR" >&2
  exit 2
fi
root="$(cd "$(dirname "$0")/.." && pwd)"
out="$1"
protoc="${PROTOC:-$(command -v protoc || true)}"
plugin="${GRPC_PYTHON_PLUGIN:-$(command -v grpc_python_plugin || echo /usr/bin/grpc_python_plugin)}"
if [ -z "$protoc" ] || [ ! -x "$protoc" ]; then
  echo "$0: protoc not found (Debian package protobuf-compiler)" >&2
  exit 1
fi
if [ ! -x "$plugin" ]; then
  echo "$0: $plugin not found (Debian package protobuf-compiler-grpc)" >&2
  exit 1
fi

mkdir -p "$out"
"$protoc" \
  --proto_path="$root/proto" \
  --python_out="$out" \
  --pyi_out="$out" \
  --plugin=protoc-gen-grpc_python="$plugin" \
  --grpc_python_out="$out" \
  strata/v1/generation.proto \
  grpc_health/v1/health.proto
# Regular packages, so that no other directory named strata/ or grpc_health/ on sys.path
# (a namespace package) can shadow or merge with them.
for d in strata strata/v1 grpc_health grpc_health/v1; do
  : > "$out/$d/__init__.py"
done
