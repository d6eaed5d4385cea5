// The device-side paged KV cache of one layer and the kernels that write new keys and values
// into it. Layout per layer, as the CPU cache but bf16: [block][k|v][slot][kv_head][head_dim].
// An FP8 cache holds E4M3 codes in the same layout (blocks half the bytes), scaled per kv
// head; its wide (16-bit) sequences take two blocks a block, keys and values apart, in bf16.
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
  // FP8 cache: `data` is bytes, 2 * block_size * kv_dim a block. A wide sequence's table row
  // starts with a negative entry: its entries are -(block + 1), a key block then a value
  // block per block_size positions, each bf16 [slot][kv_dim].
  bool fp8 = false;
  const float* k_scale = nullptr;  // [num_kv_heads] device, this layer's (fp8)
  const float* v_scale = nullptr;
  // Bytes from one block of this layer to the next: 0 when the layer's blocks lie together;
  // num_layers x a block when every layer of a block does (block-major storage).
  int64_t block_stride = 0;
};

// Bytes one layer's block takes: keys and values of block_size slots.
inline constexpr int64_t PagedKvBlockBytes(int block_size, int64_t kv_dim, bool fp8) {
  return 2 * block_size * kv_dim * (fp8 ? 1 : 2);
}

// The table entry a wide row of an FP8 cache stores for `block`, and back.
inline constexpr int32_t WideKvEntry(int32_t block) { return -block - 1; }

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
// FP8 caches: codes = saturate(round(x / scale)) for narrow rows, bf16 for wide ones.
cudaError_t LaunchPagedKvAppend(const bf16* k, int64_t k_stride, const bf16* v, int64_t v_stride,
                                const TokenBatch& tokens, const PagedKvLayer& kv,
                                cudaStream_t stream);

// Calibration: amax[h] = max(amax[h], |k[t][h][*]|), amax[kv_heads + h] the same of v, over
// the n tokens (rows k_stride / v_stride elements apart). amax holds non-negative floats.
cudaError_t LaunchKvAbsMax(const bf16* k, int64_t k_stride, const bf16* v, int64_t v_stride,
                           int64_t n, int num_kv_heads, int head_dim, float* amax,
                           cudaStream_t stream);

// A block move in block-major storage (every layer of a block together, data + block *
// num_layers * block_bytes): src copied to dst, or, when dst_v >= 0, the FP8 block of a
// sequence turned 16-bit (PagedKvCache::Widen): its codes times each layer's scales into bf16
// blocks dst (keys) and dst_v (values).
struct KvMoveBlock {
  int32_t src, dst, dst_v;
};
// Copies (dst_v < 0); block_bytes: one layer's block.
cudaError_t LaunchKvCopyBlocks(uint8_t* data, int64_t block_bytes, int num_layers,
                               const KvMoveBlock* moves, int num_moves, cudaStream_t stream);
// Widenings of an FP8 cache; scales: [layers][2][num_kv_heads] (keys, then values).
cudaError_t LaunchKvWiden(uint8_t* data, int num_layers, int block_size, int num_kv_heads,
                          int head_dim, const float* scales, const KvMoveBlock* moves,
                          int num_moves, cudaStream_t stream);

}  // namespace strata::gpu

#endif  // STRATA_COMMON_CUDA_KERNELS_PAGED_KV_KERNELS_H_
