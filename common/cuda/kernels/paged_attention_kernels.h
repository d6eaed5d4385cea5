// Attention of a step's query tokens over the paged KV cache: GQA, causal, optional sliding
// window and per-head sink logits (gpt-oss). One kernel serves prefill (many queries per
// sequence) and decode (one), with the key range split across blocks when the step has too
// few (token, kv head) pairs to fill the GPU; a second small kernel then merges the splits.
#ifndef STRATA_COMMON_CUDA_KERNELS_PAGED_ATTENTION_KERNELS_H_
#define STRATA_COMMON_CUDA_KERNELS_PAGED_ATTENTION_KERNELS_H_

#include <cstddef>

#include "common/cuda/cuda_types.h"
#include "common/cuda/kernels/paged_kv_kernels.h"
#include "common/cuda/kernels/rope_kernels.h"

namespace strata::gpu {

struct PagedAttentionParams {
  int num_heads = 0;             // query heads; a multiple of num_kv_heads
  int num_kv_heads = 0;          // must match the cache
  int head_dim = 0;              // 64, 128 or 256
  int64_t q_stride = 0;          // elements between tokens' query rows
  int64_t out_stride = 0;        // elements between tokens' output rows
  int sliding_window = 0;        // 0: all keys j <= pos; else only those with pos - j < window
  const float* sinks = nullptr;  // [num_heads] device logits joining the denominator, or null
  float scale = 0.0f;            // score scale; 0 means 1 / sqrt(head_dim)
  int max_context = 0;           // >= pos + 1 for every token of the step (sizes the splits)
  // The most query tokens one sequence has in the step: many (a prefill) take the tensor-core
  // kernel where the shape allows.
  int max_queries_per_seq = 1;
};

// How a launch divides its work; computed on the host from sizes only.
struct PagedAttentionPlan {
  int num_splits = 1;          // key-range splits per (token, head)
  int split_len = 0;           // keys per split (at most; clusters size theirs at run time)
  size_t workspace_bytes = 0;  // device scratch the launch needs (0 when num_splits == 1)
  // Decode kernel: a cluster of num_splits blocks (8 or 16) per (token, kv head chunk) shares
  // each token's keys evenly by its position and merges in shared memory (no workspace).
  // head_dim <= 128.
  bool cluster = false;
  int heads_per_block = 0;  // cluster plans: query heads a chunk takes, at most 8 (0: 8)
  // Cluster plans: long contexts split each token's keys over up to this many clusters (1 to
  // 8; those a token's length needs at run time, 128 keys a block at least), merged by the
  // last to finish through the workspace (workspace_bytes; zeroed before the first launch and
  // left so). 1: no workspace.
  int groups = 1;
  // Prefill on the tensor cores (prefill_attention.h): 64 (token, head) rows a block against
  // 64-key tiles in shared memory; one split, no workspace. head_dim 64 or 128.
  bool tensor_cores = false;
};

// Prefill steps (a sequence with 16 query tokens or more) on the tensor cores where the shape
// allows; otherwise splits the key range only when n * kv heads leaves SMs idle (for head_dim
// <= 128 through the decode kernel's clusters). `num_sms` from the device.
PagedAttentionPlan PlanPagedAttention(int64_t n, const PagedAttentionParams& params, int num_sms);

// The tensor-core prefill plan, or the one-split plan where the shape does not allow it.
PagedAttentionPlan PrefillPlan(const PagedAttentionParams& params);

// A cluster plan of `blocks` blocks a cluster (8 or 16), at most `heads_per_block` query heads
// a block (1 to 8) and up to `groups` clusters a token's keys (its workspace sized for n
// tokens), for tests and benchmarks; the one-split plan when the model's shape or the device
// (MaxDecodeClusterBlocks) does not allow it.
PagedAttentionPlan ClusterDecodePlan(const PagedAttentionParams& params, int blocks,
                                     int heads_per_block, int64_t n = 1, int groups = 1);

// The most workspace a cluster plan for up to `max_tokens` tokens takes (the key-range groups'
// partial sums and counters): one buffer of it, zeroed once, serves every cluster launch.
size_t ClusterDecodeWorkspaceBytes(int64_t max_tokens, const PagedAttentionParams& params);

// 16 where this device runs the decode kernel in clusters of 16 blocks, else 8 (asked once).
int MaxDecodeClusterBlocks();

// out[t][h] = softmax over keys j of (q[t][h] . k[j][h / group]) * scale, times v, for each
// token t of `tokens` (its keys and value already appended to `kv`) and head h. `workspace`
// holds plan.workspace_bytes (may be null when that is 0). The cache must be 16-byte aligned,
// `out` 4-byte aligned with an even out_stride. A cluster plan with groups > 1 needs its
// workspace zeroed before its first launch (the kernel leaves it so).
cudaError_t LaunchPagedAttention(const bf16* q, const TokenBatch& tokens, const PagedKvLayer& kv,
                                 const PagedAttentionParams& params, const PagedAttentionPlan& plan,
                                 void* workspace, bf16* out, cudaStream_t stream);

// A decode step with LaunchQkNormRope and LaunchPagedKvAppend fused in, for a cluster plan
// (plan.cluster) whose tokens all belong to different sequences: q [n, q_stride], k and v
// [n, kv_stride] are the step's raw projections (unrotated); each token's key (normalized and
// rotated) and value go into the cache at its position, and the output is as
// LaunchPagedAttention's after those two launches. q and k are not modified. Full rotary only
// (rope.rope_dim 0 or head_dim).
cudaError_t LaunchPagedDecodeWithRope(const bf16* q, const bf16* k, const bf16* v,
                                      int64_t kv_stride, const TokenBatch& tokens,
                                      const PagedKvLayer& kv, const PagedAttentionParams& params,
                                      const QkRopeParams& rope, const PagedAttentionPlan& plan,
                                      void* workspace, bf16* out, cudaStream_t stream);

}  // namespace strata::gpu

#endif  // STRATA_COMMON_CUDA_KERNELS_PAGED_ATTENTION_KERNELS_H_
