# Sourced first by the GPU-machine call scripts (trust_call.sh, prefill_call.sh): unpacks what
# bench/gpu/pack_device.sh packed, sets LD_LIBRARY_PATH, and puts the binaries in $build/bin
# (default build-cuda), where the tests look for `strata`; $final gets summary.txt, opened with
# the GPU's name.
mkdir -p "$final" .device-ipc
# models/ and tests/data/oracles/ may travel as links to where they were moved aside.
for d in models tests/data/oracles; do [ -L "$d" ] && rm "$d"; done
tar xJf .device-ipc/bundle.tar.xz -C .device-ipc && tar xJf .device-ipc/oracles.tar.xz &&
  tar xJf .device-demo/demo.tar.xz || exit 3
export LD_LIBRARY_PATH=$PWD/.device-ipc/lib:/usr/local/cuda/lib64 NCCL_NVLS_ENABLE=0
# The tests find their data and `strata` where they were built (/work/main/BUILD_DIR).
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
mkdir -p "${build:-build-cuda}/bin" && cp -f .device-ipc/bin/* "${build:-build-cuda}/bin/"
sum=$final/summary.txt
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$sum"
