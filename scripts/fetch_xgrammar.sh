#!/usr/bin/env bash
# Fetches xgrammar's source (the grammar engine of structured output: docs/structured-output.md)
# into third_party/xgrammar-<version>/, git-ignored, where CMake finds it (cmake/Xgrammar.cmake).
# The pinned PyPI source distribution is checked against its sha256 before it is unpacked; only
# its C++ core is built. Safe to run again: nothing is downloaded when the tree is there.
# STRATA_XGRAMMAR_TARBALL: a local copy of the tarball to use instead of downloading it.
set -euo pipefail
cd "$(dirname "$0")/.."
version=0.2.9
sha256=87b466bca2475e29bb0323abc62c6c33cbcbcff47e5fb800a3e2099ac9620b90
url="https://files.pythonhosted.org/packages/3a/2f/5bf8e8fa6619cff534932f79b0abc81a417d354bc5093252c1a6081d0a93/xgrammar-${version}.tar.gz"
dir=third_party
tree="$dir/xgrammar-$version"
tarball="$dir/xgrammar-$version.tar.gz"
if [ -f "$tree/include/xgrammar/xgrammar.h" ]; then
  echo "fetch_xgrammar: $tree present"
  exit 0
fi
mkdir -p "$dir"
if [ -n "${STRATA_XGRAMMAR_TARBALL:-}" ]; then
  cp "$STRATA_XGRAMMAR_TARBALL" "$tarball.part"
elif command -v curl >/dev/null; then
  curl --fail --silent --show-error --location --retry 3 -o "$tarball.part" "$url"
else
  python3 -c 'import sys, urllib.request; urllib.request.urlretrieve(sys.argv[1], sys.argv[2])' \
    "$url" "$tarball.part"
fi
if ! echo "$sha256  $tarball.part" | sha256sum --check --status; then
  rm -f "$tarball.part"
  echo "fetch_xgrammar: the download's sha256 is not $sha256" >&2
  exit 1
fi
mv "$tarball.part" "$tarball"
rm -rf "$tree.part"
mkdir -p "$tree.part"
tar -xzf "$tarball" -C "$tree.part" --strip-components=1
mv "$tree.part" "$tree"
rm -f "$tarball"
echo "fetch_xgrammar: unpacked xgrammar $version into $tree"
