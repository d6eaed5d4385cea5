# Sourced by the GPU scripts: the `machine` label of their records, from the card the call got
# (the device tool may hand out an H100 or an H200), e.g. "NVIDIA H200 (1 GPU)".
#   machine_name [GPUS]
machine_name() {
  local name
  name=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
  echo "${name:-unknown GPU} (${1:-1} GPU)"
}
