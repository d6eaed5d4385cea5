#!/usr/bin/env bash
# Prints, one per line, the Debian/Ubuntu packages that own the shared libraries the given
# binaries load (ldd), so that the runtime image installs exactly those and nothing else.
# Used by deploy/Dockerfile's build stage; run it by hand to see the list:
#   deploy/runtime-packages.sh build/bin/strata build/bin/strata-*
# Fails, naming the library, when a library belongs to no package (e.g. one built by hand),
# since the runtime image could not install it. Libraries under /usr/local/cuda (libcudart,
# libcublasLt) are skipped: the CUDA runtime image provides them; the driver's (libcuda,
# libnvidia-*) come from the NVIDIA container toolkit when the container starts.
set -euo pipefail
[ $# -gt 0 ] || { echo "usage: $0 BINARY..." >&2; exit 2; }

owner() {  # the package that owns $1; usrmerge means dpkg may know it as /lib/... or /usr/lib/...
  local path=$1 candidates=("$1") out
  case $path in
    /usr/lib/*) candidates+=("${path#/usr}") ;;
    /lib/*) candidates+=("/usr$path") ;;
  esac
  for c in "${candidates[@]}"; do
    if out=$(dpkg-query -S "$c" 2>/dev/null); then
      # "pkg:arch: /path" (or "pkg1, pkg2: /path" for shared files): keep the first package.
      out=${out%%: *}
      out=${out%%,*}
      echo "${out%%:*}"
      return 0
    fi
  done
  return 1
}

libs=""
for bin in "$@"; do
  out=$(ldd "$bin") || { echo "runtime-packages: ldd $bin failed" >&2; exit 1; }
  # The NVIDIA driver's libraries (libcuda, libnvidia-*) are absent where images are built; the
  # container toolkit mounts them at run time.
  missing=$(grep 'not found' <<<"$out" | grep -vE 'lib(cuda|nvidia-[a-z-]+)\.so' || true)
  if [ -n "$missing" ]; then
    echo "runtime-packages: $bin: $(head -1 <<<"$missing")" >&2
    exit 1
  fi
  libs+="$(awk '/=> \// {print $3}' <<<"$out")"$'\n'
done

declare -A packages=()
status=0
while read -r lib; do
  [ -n "$lib" ] || continue
  case $lib in /usr/local/cuda*|*/libcuda.so*|*/libnvidia-*) continue ;; esac
  found=""
  for path in "$lib" "$(readlink -f "$lib")"; do
    if pkg=$(owner "$path"); then found=$pkg; break; fi
  done
  if [ -z "$found" ]; then
    echo "runtime-packages: no package owns $lib" >&2
    status=1
    continue
  fi
  packages[$found]=1
done < <(sort -u <<<"$libs")
[ $status -eq 0 ] || exit $status
printf '%s\n' "${!packages[@]}" | sort
