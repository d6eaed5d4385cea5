#include "common/cuda/device_utils.cuh"
#include "common/cuda/kernels/paged_kv_access.cuh"
#include "common/cuda/kernels/paged_kv_kernels.h"

namespace strata::gpu {
namespace {

constexpr int kThreads = 128;

// One block per token; threads copy the key row then the value row, 16 bytes at a time when
// the rows allow it (bf16 slots), or quantize them (an FP8 cache's narrow rows).
template <bool kVec>
__global__ void __launch_bounds__(kThreads)
    PagedKvAppendKernel(const bf16* __restrict__ k, int64_t k_stride, const bf16* __restrict__ v,
                        int64_t v_stride, TokenBatch tokens, PagedKvLayer kv) {
  const int64_t t = blockIdx.x;
  const int64_t pos = tokens.pos[t];
  const int64_t kv_dim = int64_t{kv.num_kv_heads} * kv.head_dim;
  const int32_t* table = kv.block_tables + int64_t{tokens.seq[t]} * kv.max_blocks_per_seq;
  const bool wide = KvRowIsWide(kv, table);
  const KvSlotPtrs slot = KvSlotAt(kv, table, wide, pos, 0, kv_dim);
  const bf16* k_src = k + t * k_stride;
  const bf16* v_src = v + t * v_stride;
  if (kv.fp8 && !wide) {
    for (int64_t i = threadIdx.x; i < 2 * kv_dim; i += kThreads) {
      if (i < kv_dim) {
        slot.k[i] = FloatToE4M3(__bfloat162float(k_src[i]) / kv.k_scale[i / kv.head_dim]);
      } else {
        const int64_t j = i - kv_dim;
        slot.v[j] = FloatToE4M3(__bfloat162float(v_src[j]) / kv.v_scale[j / kv.head_dim]);
      }
    }
    return;
  }
  bf16* k_dst = reinterpret_cast<bf16*>(slot.k);
  bf16* v_dst = reinterpret_cast<bf16*>(slot.v);
  if constexpr (kVec) {
    const int64_t chunks = kv_dim / 8;
    for (int64_t c = threadIdx.x; c < 2 * chunks; c += kThreads) {
      if (c < chunks) {
        reinterpret_cast<uint4*>(k_dst)[c] = __ldg(reinterpret_cast<const uint4*>(k_src) + c);
      } else {
        reinterpret_cast<uint4*>(v_dst)[c - chunks] =
            __ldg(reinterpret_cast<const uint4*>(v_src) + c - chunks);
      }
    }
  } else {
    for (int64_t i = threadIdx.x; i < 2 * kv_dim; i += kThreads) {
      if (i < kv_dim) {
        k_dst[i] = k_src[i];
      } else {
        v_dst[i - kv_dim] = v_src[i - kv_dim];
      }
    }
  }
}

// One block per token: each thread folds its elements' magnitudes into the per-head maxima
// (non-negative floats order as their bits do).
__global__ void __launch_bounds__(kThreads)
    KvAbsMaxKernel(const bf16* __restrict__ k, int64_t k_stride, const bf16* __restrict__ v,
                   int64_t v_stride, int num_kv_heads, int head_dim, float* amax) {
  const int64_t t = blockIdx.x;
  const int64_t kv_dim = int64_t{num_kv_heads} * head_dim;
  for (int64_t i = threadIdx.x; i < 2 * kv_dim; i += kThreads) {
    const bool is_v = i >= kv_dim;
    const int64_t j = is_v ? i - kv_dim : i;
    const float x = fabsf(__bfloat162float(is_v ? v[t * v_stride + j] : k[t * k_stride + j]));
    const int slot = (is_v ? num_kv_heads : 0) + static_cast<int>(j / head_dim);
    atomicMax(reinterpret_cast<int*>(amax) + slot, __float_as_int(x));
  }
}

// One block per (move, layer): the FP8 block's codes times the layer's scales, as bf16.
__global__ void __launch_bounds__(kThreads)
    KvWidenKernel(uint8_t* data, int num_layers, int block_size, int num_kv_heads, int head_dim,
                  const float* __restrict__ scales, const KvMoveBlock* __restrict__ moves) {
  const KvMoveBlock m = moves[blockIdx.x];
  const int layer = blockIdx.y;
  const int64_t kv_dim = int64_t{num_kv_heads} * head_dim;
  const int64_t block_bytes = PagedKvBlockBytes(block_size, kv_dim, true);
  auto at = [&](int32_t block) {
    return data + (int64_t{block} * num_layers + layer) * block_bytes;
  };
  const uint8_t* src = at(m.src);
  bf16* k_dst = reinterpret_cast<bf16*>(at(m.dst));
  bf16* v_dst = reinterpret_cast<bf16*>(at(m.dst_v));
  const float* k_scale = scales + int64_t{layer} * 2 * num_kv_heads;
  const float* v_scale = k_scale + num_kv_heads;
  const int64_t n = int64_t{block_size} * kv_dim;
  for (int64_t i = threadIdx.x; i < n; i += kThreads) {
    const int head = static_cast<int>(i % kv_dim) / head_dim;
    k_dst[i] = __float2bfloat16(E4M3ToFloat(src[i]) * k_scale[head]);
    v_dst[i] = __float2bfloat16(E4M3ToFloat(src[n + i]) * v_scale[head]);
  }
}

// A block's span (every layer of it) is copied in pieces of this many bytes, one thread block
// each, so that a few moves still spread over the GPU.
constexpr int64_t kCopyPieceBytes = 64 << 10;

// One block per (move, piece): that piece of block src's span into dst, 16 bytes at a time.
__global__ void __launch_bounds__(kThreads)
    KvCopyBlocksKernel(uint8_t* data, int64_t span, const KvMoveBlock* __restrict__ moves) {
  const KvMoveBlock m = moves[blockIdx.x];
  const int64_t begin = int64_t{blockIdx.y} * kCopyPieceBytes / 16;
  const int64_t end = min(span, int64_t{blockIdx.y + 1} * kCopyPieceBytes) / 16;
  const uint4* src = reinterpret_cast<const uint4*>(data + int64_t{m.src} * span);
  uint4* dst = reinterpret_cast<uint4*>(data + int64_t{m.dst} * span);
  for (int64_t i = begin + threadIdx.x; i < end; i += kThreads) dst[i] = src[i];
}

bool Aligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

cudaError_t LaunchPagedKvAppend(const bf16* k, int64_t k_stride, const bf16* v, int64_t v_stride,
                                const TokenBatch& tokens, const PagedKvLayer& kv,
                                cudaStream_t stream) {
  if (tokens.n < 0 || tokens.n > 0x7fffffff || kv.block_size <= 0 || kv.num_kv_heads <= 0 ||
      kv.head_dim <= 0 || kv.max_blocks_per_seq <= 0) {
    return cudaErrorInvalidValue;
  }
  if (tokens.n == 0) return cudaSuccess;
  const int64_t kv_dim = int64_t{kv.num_kv_heads} * kv.head_dim;
  if (kv.fp8 && (kv.k_scale == nullptr || kv.v_scale == nullptr)) return cudaErrorInvalidValue;
  const bool vec = kv_dim % 8 == 0 && k_stride % 8 == 0 && v_stride % 8 == 0 && Aligned(k) &&
                   Aligned(v) && Aligned(kv.data);
  const unsigned blocks = static_cast<unsigned>(tokens.n);
  if (vec) {
    PagedKvAppendKernel<true>
        <<<blocks, kThreads, 0, stream>>>(k, k_stride, v, v_stride, tokens, kv);
  } else {
    PagedKvAppendKernel<false>
        <<<blocks, kThreads, 0, stream>>>(k, k_stride, v, v_stride, tokens, kv);
  }
  return cudaGetLastError();
}

cudaError_t LaunchKvAbsMax(const bf16* k, int64_t k_stride, const bf16* v, int64_t v_stride,
                           int64_t n, int num_kv_heads, int head_dim, float* amax,
                           cudaStream_t stream) {
  if (n < 0 || n > 0x7fffffff || num_kv_heads <= 0 || head_dim <= 0 || amax == nullptr) {
    return cudaErrorInvalidValue;
  }
  if (n == 0) return cudaSuccess;
  KvAbsMaxKernel<<<static_cast<unsigned>(n), kThreads, 0, stream>>>(k, k_stride, v, v_stride,
                                                                    num_kv_heads, head_dim, amax);
  return cudaGetLastError();
}

cudaError_t LaunchKvCopyBlocks(uint8_t* data, int64_t block_bytes, int num_layers,
                               const KvMoveBlock* moves, int num_moves, cudaStream_t stream) {
  const int64_t span = block_bytes * num_layers;
  if (num_moves < 0 || num_layers <= 0 || block_bytes <= 0 || span % 16 != 0 || !Aligned(data)) {
    return cudaErrorInvalidValue;
  }
  if (num_moves == 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>(num_moves),
                  static_cast<unsigned>((span + kCopyPieceBytes - 1) / kCopyPieceBytes));
  if ((span + kCopyPieceBytes - 1) / kCopyPieceBytes > 65535) return cudaErrorInvalidValue;
  KvCopyBlocksKernel<<<grid, kThreads, 0, stream>>>(data, span, moves);
  return cudaGetLastError();
}

cudaError_t LaunchKvWiden(uint8_t* data, int num_layers, int block_size, int num_kv_heads,
                          int head_dim, const float* scales, const KvMoveBlock* moves,
                          int num_moves, cudaStream_t stream) {
  if (num_moves < 0 || num_layers <= 0 || num_layers > 65535 || block_size <= 0 ||
      num_kv_heads <= 0 || head_dim <= 0 || scales == nullptr) {
    return cudaErrorInvalidValue;
  }
  if (num_moves == 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>(num_moves), static_cast<unsigned>(num_layers));
  KvWidenKernel<<<grid, kThreads, 0, stream>>>(data, num_layers, block_size, num_kv_heads, head_dim,
                                               scales, moves);
  return cudaGetLastError();
}

}  // namespace strata::gpu
