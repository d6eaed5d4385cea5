// The device-side paged KV cache of one layer and the kernel that writes new keys and values
// into it. Layout per layer, as the CPU cache but bf16: [block][k|v][slot][kv_head][head_dim].
#ifndef STRATA_COMMON_CUDA_KERNELS_PAGED_KV_KERNELS_H_
#define STRATA_COMMON_CUDA_KERNELS_PAGED_KV_KERNELS_H_

#include "common/cuda/cuda_types.h"

namespace strata::gpu {

// One layer of the cache plus the block tables of the step's sequences. Passed by value.
struct PagedKvLayer {
  bf16* data = nullptr;                   // this layer's blocks
  const int32_t* block_tables = nullptr;  // [num_seqs][max_blocks_per_seq], device
  int max_blocks_per_seq = 0;
  int block_size = 0;  // token slots per block
  int num_kv_heads = 0;
  int head_dim = 0;
};

// The tokens of a step: token t belongs to row seq[t] of the block tables and sits at
// position pos[t] of its sequence (device arrays of n entries). seq, pos and the block tables
// must not be written by a kernel of the step (copies from the host only): the decode
// attention reads them before it waits for the kernel before it.
struct TokenBatch {
  const int32_t* seq = nullptr;
  const int32_t* pos = nullptr;
  int64_t n = 0;
};

// Element offset of (block, kv, slot) inside one layer; kv is 0 for keys, 1 for values.
inline constexpr int64_t PagedKvOffset(int64_t block, int kv, int64_t slot, int block_size,
                                       int64_t kv_dim) {
  return ((block * 2 + kv) * block_size + slot) * kv_dim;
}

// For each token t, copies k[t] and v[t] (kv_heads * head_dim each, rows k_stride / v_stride
// elements apart) into its slot: block block_tables[seq[t]][pos[t] / block_size], slot
// pos[t] % block_size. Positions must be reserved in the block tables.
cudaError_t LaunchPagedKvAppend(const bf16* k, int64_t k_stride, const bf16* v, int64_t v_stride,
                                const TokenBatch& tokens, const PagedKvLayer& kv,
                                cudaStream_t stream);

}  // namespace strata::gpu

#endif  // STRATA_COMMON_CUDA_KERNELS_PAGED_KV_KERNELS_H_
