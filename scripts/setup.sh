#!/usr/bin/env bash
# Installs the build and test dependencies from Debian's packages. Safe to run again.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config curl ca-certificates
  python3 python3-grpcio python3-protobuf
  python3-venv python3-pip
  libabsl-dev nlohmann-json3-dev libyaml-cpp-dev
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libboost-dev libnuma-dev libpcre2-dev libicu-dev
  googletest libgtest-dev libgmock-dev
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#packages[@]} packages present"
  exit 0
fi
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
echo "setup: installing ${missing[*]}"
$SUDO apt-get update
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y --no-install-recommends "${missing[@]}"
