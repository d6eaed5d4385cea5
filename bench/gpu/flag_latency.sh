#!/usr/bin/env bash
# On the GPU machine: flag_pingpong's hand-over cost in every mode and for the shipped and the
# folded chains of operations, with no work and with 20 us of work a side, without and then
# with a CUDA MPS daemon (started and stopped here, private pipe directory). About 30 s.
# Binary in .device-ipc/bin (bench/gpu/pack_device.sh puts it there).
#   bash bench/gpu/flag_latency.sh
set -u
B=.device-ipc/bin/flag_pingpong
run() {
  for mode in local memop kernel; do
    for work in 0 20; do timeout 60 $B --mode $mode --work-us $work --layers 48 --reps 100; done
  done
  # The operations around each hand-over: as shipped, and folded into kernels.
  for chain in strata folded; do
    for work in 0 20; do timeout 60 $B --chain $chain --work-us $work --layers 48 --reps 100; done
  done
}
echo "== no MPS"; run
export CUDA_MPS_PIPE_DIRECTORY=/tmp/pingpong-mps CUDA_MPS_LOG_DIRECTORY=/tmp/pingpong-mps-log
mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
nvidia-cuda-mps-control -d && sleep 1
echo "== MPS"; run
echo quit | nvidia-cuda-mps-control
