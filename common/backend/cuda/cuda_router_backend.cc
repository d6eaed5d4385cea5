#include "common/backend/cuda/cuda_router_backend.h"

#include <algorithm>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/backend/cuda_model_support.h"
#include "common/cuda/kernels/elementwise_kernels.h"
#include "common/cuda/kernels/embedding_kernels.h"
#include "common/cuda/kernels/gemv_kernels.h"
#include "common/cuda/kernels/grouped_expert_kernels.h"
#include "common/cuda/kernels/moe_gate_kernels.h"
#include "common/cuda/kernels/norm_gate_kernels.h"
#include "common/cuda/kernels/norm_kernels.h"
#include "common/cuda/kernels/paged_attention_kernels.h"
#include "common/cuda/kernels/paged_kv_kernels.h"
#include "common/cuda/kernels/rope_kernels.h"
#include "common/cuda/kernels/sampling_kernels.h"
#include "common/util/status_macros.h"
#include "common/util/tunables.h"

namespace strata::gpu {
namespace {

template <typename T>
absl::Status Allocate(DeviceBuffer<T>& buffer, size_t count) {
  ASSIGN_OR_RETURN(buffer, DeviceBuffer<T>::Allocate(std::max<size_t>(count, 1)));
  return absl::OkStatus();
}

}  // namespace

template <typename T>
absl::Status CudaRouterBackend::Stage(const T* host, size_t count, PinnedBuffer<T>& pinned,
                                      DeviceBuffer<T>& device) {
  if (count > pinned.size() || count > device.size()) {
    return absl::InvalidArgumentError("cuda backend: step larger than its buffers");
  }
  if (count == 0) return absl::OkStatus();
  if (host != pinned.data()) std::copy(host, host + count, pinned.data());
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(device.data(), pinned.data(), count * sizeof(T),
                                       cudaMemcpyHostToDevice, context_->stream()));
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<CudaRouterBackend>> CudaRouterBackend::Create(
    const Model& model, const KvPoolOptions& kv, CudaContext* context, CudaBackendOptions options) {
  std::unique_ptr<CudaRouterBackend> b(new CudaRouterBackend(model, context, options));
  RETURN_IF_ERROR(b->Load(model, kv));
  return b;
}

absl::Status CudaRouterBackend::Load(const Model& model, const KvPoolOptions& kv) {
  const ModelConfig& c = config_;
  RETURN_IF_ERROR(CudaRouterSupports(c));
  if (!c.mla() && c.head_dim != 64 && c.head_dim != 128 && c.head_dim != 256) {
    return absl::UnimplementedError(absl::StrCat(
        "the CUDA attention kernel takes head_dim 64, 128 or 256; this model has ", c.head_dim));
  }
  const ModelWeights& w = model.weights;
  const int64_t h = c.hidden_size;
  const int64_t q_dim = int64_t{c.num_heads} * c.head_dim;
  const int64_t kv_dim = int64_t{c.num_kv_heads} * c.head_dim;
  ASSIGN_OR_RETURN(DeviceWeight embedding, store_.Matrix(w.embedding));
  embedding_ = static_cast<const bf16*>(embedding.data);
  if (w.lm_head.data == w.embedding.data) {
    lm_head_ = embedding;  // tied
  } else {
    ASSIGN_OR_RETURN(lm_head_, store_.Matrix(w.lm_head));
  }
  ASSIGN_OR_RETURN(final_norm_, store_.Vector(w.final_norm));
  int64_t ffn_intermediate = 1;
  layers_.resize(c.num_layers);
  for (int l = 0; l < c.num_layers; ++l) {
    const strata::LayerWeights& src = w.layers[l];
    LayerWeights& dst = layers_[l];
    const AttentionWeights& a = src.attention;
    const WeightFormat format = options_.attention_format;
    ASSIGN_OR_RETURN(dst.q, store_.Matrix(a.q, a.q_bias, format));
    if (c.mla()) {
      RETURN_IF_ERROR(LoadLatentWeights(a, format, dst));
    } else {
      ASSIGN_OR_RETURN(dst.k, store_.Matrix(a.k, a.k_bias, format));
      ASSIGN_OR_RETURN(dst.v, store_.Matrix(a.v, a.v_bias, format));
    }
    ASSIGN_OR_RETURN(dst.o, store_.Matrix(a.o, a.o_bias, format));
    if (format == WeightFormat::kFp8E4M3) {
      // Steps past the GEMV's token count dequantize into scratch: sized now, before a graph
      // captures such a step.
      for (const DeviceWeight* m : {&dst.q, &dst.k, &dst.v, &dst.o, &dst.q_a, &dst.kv_a}) {
        RETURN_IF_ERROR(linear_.ReserveFp8Scratch(m->out * m->in));
      }
    }
    ASSIGN_OR_RETURN(dst.input_norm, store_.Vector(src.input_norm));
    ASSIGN_OR_RETURN(dst.post_norm, store_.Vector(src.post_attention_norm));
    ASSIGN_OR_RETURN(dst.q_norm, store_.Vector(a.q_norm));
    ASSIGN_OR_RETURN(dst.k_norm, store_.Vector(a.k_norm));
    ASSIGN_OR_RETURN(dst.sinks, store_.FloatVector(a.sinks));
    if (c.layer_is_moe[l]) {
      ASSIGN_OR_RETURN(dst.router, store_.Matrix(src.router, src.router_bias));
      ASSIGN_OR_RETURN(dst.correction_bias, store_.FloatVector(src.router_correction_bias));
    }
    const FfnWeights* ffn = src.dense_mlp       ? &*src.dense_mlp
                            : src.shared_expert ? &*src.shared_expert
                                                : nullptr;
    if (ffn != nullptr) {
      dst.has_ffn = true;
      ASSIGN_OR_RETURN(dst.ffn, store_.SingleExpert(*ffn));
      ffn_intermediate = std::max(ffn_intermediate, ffn->gate.out);
    }
    if (src.shared_expert_gate.present()) {
      // Its one row as float32 (At applies an FP8 checkpoint's row scale).
      const WeightMatrix& g = src.shared_expert_gate;
      std::vector<float> row(static_cast<size_t>(g.in));
      for (int64_t i = 0; i < g.in; ++i) row[i] = g.At(0, i);
      ASSIGN_OR_RETURN(dst.shared_gate,
                       store_.Vector(WeightVector{row.data(), DType::kF32, g.in, 1}));
    }
  }
  const RopeTable rope = BuildRopeTable(c.rope, c.RopeDim());
  ASSIGN_OR_RETURN(float* inv_freq, store_.Upload(rope.inv_freq.data(), rope.inv_freq.size()));
  inv_freq_ = inv_freq;
  attention_scaling_ = rope.attention_scaling;

  block_size_ = kv.cache.block_size;
  kv_fp8_ = kv.fp8();
  // Block-major: every layer of a block together, so that the blocks past a shrunk pool's end
  // (PagedKvCache::Resize) are one range. An FP8 block is half a bf16 one.
  // A latent cache's rows are keys and values at once: no value rows.
  kv_block_bytes_ =
      PagedKvBlockBytes(kv.cache.block_size, kv_dim, kv.fp8()) / (c.KvValuesInKeys() ? 2 : 1);
  // Addresses for every block the pool may grow to; memory for the active ones (SyncKv
  // follows Resize, so a shrunk pool's memory goes back to the device).
  ASSIGN_OR_RETURN(kv_memory_,
                   VirtualDeviceMemory::Create(
                       context_->device(), KvBytes(kv.num_blocks),
                       KvBytes(kv.initial_blocks > 0 ? kv.initial_blocks : kv.num_blocks)));
  if (kv.fp8()) {
    const size_t entries = static_cast<size_t>(c.num_layers) * 2 * c.num_kv_heads;
    ASSIGN_OR_RETURN(
        kv_scales_, DeviceBuffer<float>::FromHost(std::vector<float>(entries, 1.0f).data(), entries,
                                                  context_->stream()));
    ASSIGN_OR_RETURN(
        kv_amax_, DeviceBuffer<float>::FromHost(std::vector<float>(entries, 0.0f).data(), entries,
                                                context_->stream()));
  }

  const size_t t = static_cast<size_t>(options_.max_tokens);
  RETURN_IF_ERROR(Allocate(hidden_, t * h));
  RETURN_IF_ERROR(Allocate(normed_, t * h));
  RETURN_IF_ERROR(Allocate(q_, t * q_dim));
  RETURN_IF_ERROR(Allocate(k_, t * kv_dim));
  RETURN_IF_ERROR(Allocate(v_, t * kv_dim));
  RETURN_IF_ERROR(
      Allocate(attn_, t * std::max<int64_t>(q_dim, int64_t{c.num_heads} * c.v_head_dim)));
  if (c.mla()) {
    RETURN_IF_ERROR(Allocate(latent_q_, t * std::max(c.q_lora_rank, 1)));
    RETURN_IF_ERROR(Allocate(latent_queries_, t * c.num_heads * kv_dim));
    RETURN_IF_ERROR(Allocate(latent_out_, t * c.num_heads * c.kv_lora_rank));
  }
  RETURN_IF_ERROR(Allocate(proj_, t * h));
  RETURN_IF_ERROR(Allocate(ffn_out_, t * h));
  RETURN_IF_ERROR(Allocate(gathered_, t * h));
  RETURN_IF_ERROR(Allocate(gate_logits_, t * std::max(c.num_experts, 1)));
  RETURN_IF_ERROR(Allocate(logits_, t * c.vocab_size));
  RETURN_IF_ERROR(Allocate(ids_, t));
  RETURN_IF_ERROR(Allocate(positions_, t));
  RETURN_IF_ERROR(Allocate(token_seq_, t));
  RETURN_IF_ERROR(Allocate(rows_, t));
  RETURN_IF_ERROR(Allocate(routing_ids_, t * std::max(c.top_k, 1)));
  RETURN_IF_ERROR(Allocate(predict_normed_, t * h));
  RETURN_IF_ERROR(Allocate(predicted_ids_, t * std::max(c.top_k, 1)));
  RETURN_IF_ERROR(Allocate(predicted_weights_, t * std::max(c.top_k, 1)));
  RETURN_IF_ERROR(Allocate(prediction_counts_, 3));
  CUDA_RETURN_IF_ERROR(cudaMemset(prediction_counts_.data(), 0, 3 * sizeof(unsigned long long)));
  ASSIGN_OR_RETURN(prediction_counts_host_, PinnedBuffer<unsigned long long>::Allocate(3));
  std::fill_n(prediction_counts_host_.data(), 3, 0ull);
  RETURN_IF_ERROR(Allocate(routing_weights_, t * std::max(c.top_k, 1)));
  RETURN_IF_ERROR(Allocate(gate_blocks_done_, 1));
  CUDA_RETURN_IF_ERROR(
      cudaMemsetAsync(gate_blocks_done_.data(), 0, sizeof(uint32_t), context_->stream()));
  RETURN_IF_ERROR(
      Allocate(block_tables_, static_cast<size_t>(options_.max_sequences) * kv.num_blocks));
  num_blocks_ = kv.num_blocks;
  RETURN_IF_ERROR(AllocateHostInputs(
      host_[0], t, static_cast<size_t>(options_.max_sequences) * kv.num_blocks, 1));
  RETURN_IF_ERROR(
      Allocate(ffn_workspace_, ExpertWorkspaceBytes(options_.max_tokens, 1, h, ffn_intermediate)));
  {
    // Cluster decode plans (at most 2 x SMs tokens) share one workspace whose counters stay
    // zero between launches.
    PagedAttentionParams params;
    params.num_heads = c.num_heads;
    params.head_dim = c.head_dim;
    const size_t bytes =
        c.mla()
            ? 0  // the latent attention needs none
            : ClusterDecodeWorkspaceBytes(
                  std::min<int64_t>(options_.max_tokens, 2 * int64_t{context_->num_sms()}), params);
    RETURN_IF_ERROR(Allocate(cluster_workspace_, std::max<size_t>(bytes, 16)));
    CUDA_RETURN_IF_ERROR(cudaMemsetAsync(cluster_workspace_.data(), 0, cluster_workspace_.size(),
                                         context_->stream()));
  }
  ASSIGN_OR_RETURN(single_ids_, DeviceBuffer<int32_t>::FromHost(std::vector<int32_t>(t, 0).data(),
                                                                t, context_->stream()));
  ASSIGN_OR_RETURN(single_weights_, DeviceBuffer<float>::FromHost(
                                        std::vector<float>(t, 1.0f).data(), t, context_->stream()));
  keep_alive_ = std::make_shared<int>(0);
  return absl::OkStatus();
}

absl::Status CudaRouterBackend::PrepareGraphs(int max_context, int max_sequences) {
  const ModelConfig& c = config_;
  if (max_sequences <= 0 || max_sequences > options_.max_sequences ||
      max_sequences > options_.max_tokens || max_context <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cuda backend: decode graphs of up to ", max_sequences, " sequences"));
  }
  // Captured graphs keep these pointers: sized once for every batch size, never reallocated
  // (an eager step may grow its own attention workspace freely).
  PagedAttentionParams params;
  params.num_heads = c.num_heads;
  params.num_kv_heads = c.num_kv_heads;
  params.head_dim = c.head_dim;
  params.q_stride = int64_t{c.num_heads} * c.head_dim;
  params.out_stride = params.q_stride;
  params.max_context = max_context;
  size_t workspace = 0;
  for (int n = 1; n <= max_sequences && !c.mla(); ++n) {
    workspace =
        std::max(workspace, PlanPagedAttention(n, params, context_->num_sms()).workspace_bytes);
  }
  RETURN_IF_ERROR(Allocate(graph_attention_workspace_, workspace));
  ASSIGN_OR_RETURN(pinned_logits_, PinnedBuffer<float>::Allocate(
                                       static_cast<size_t>(max_sequences) * c.vocab_size));
  RETURN_IF_ERROR(Allocate(greedy_, max_sequences));
  RETURN_IF_ERROR(Allocate(sampling_, max_sequences));
  RETURN_IF_ERROR(Allocate(token_history_, static_cast<size_t>(max_sequences) * kTokenHistory));
  RETURN_IF_ERROR(Allocate(argmax_scratch_, ArgmaxScratchBytes(max_sequences, c.vocab_size)));
  RETURN_IF_ERROR(Allocate(sample_scratch_, SampleScratchBytes(max_sequences, c.vocab_size)));
  graph_max_context_ = max_context;
  // A wide row of an FP8 cache takes two entries a block.
  graph_max_blocks_ =
      std::min(num_blocks_, (max_context + block_size_ - 1) / block_size_ * (kv_fp8_ ? 2 : 1));
  // Slot 0 keeps the eager steps' larger inputs; the second slot is only ever a graph's.
  const size_t sequences = static_cast<size_t>(max_sequences);
  ASSIGN_OR_RETURN(host_[0].greedy, PinnedBuffer<int32_t>::Allocate(sequences));
  ASSIGN_OR_RETURN(host_[0].sampling, PinnedBuffer<SampleParams>::Allocate(sequences));
  ASSIGN_OR_RETURN(host_[0].entries,
                   PinnedBuffer<LogitEntry>::Allocate(sequences * kMaxDeviceTransformTokens));
  RETURN_IF_ERROR(
      AllocateHostInputs(host_[1], sequences, sequences * graph_max_blocks_, sequences));
  graph_prepared_sequences_ = max_sequences;
  return absl::OkStatus();
}

absl::Status CudaRouterBackend::AllocateHostInputs(HostInputs& inputs, size_t tokens,
                                                   size_t table_entries, size_t greedy) {
  ASSIGN_OR_RETURN(inputs.ids, PinnedBuffer<int32_t>::Allocate(tokens));
  ASSIGN_OR_RETURN(inputs.positions, PinnedBuffer<int32_t>::Allocate(tokens));
  ASSIGN_OR_RETURN(inputs.token_seq, PinnedBuffer<int32_t>::Allocate(tokens));
  ASSIGN_OR_RETURN(inputs.rows, PinnedBuffer<int32_t>::Allocate(tokens));
  ASSIGN_OR_RETURN(inputs.tables,
                   PinnedBuffer<int32_t>::Allocate(std::max<size_t>(table_entries, 1)));
  ASSIGN_OR_RETURN(inputs.greedy, PinnedBuffer<int32_t>::Allocate(greedy));
  ASSIGN_OR_RETURN(inputs.sampling, PinnedBuffer<SampleParams>::Allocate(greedy));
  ASSIGN_OR_RETURN(inputs.entries,
                   PinnedBuffer<LogitEntry>::Allocate(greedy * kMaxDeviceTransformTokens));
  return absl::OkStatus();
}

absl::Status CudaRouterBackend::EnterGraphMode(int sequences, int slot) {
  if (sequences <= 0 || sequences > graph_prepared_sequences_) {
    return absl::FailedPreconditionError(absl::StrCat("cuda backend: a decode graph of ", sequences,
                                                      " sequences; prepared for ",
                                                      graph_prepared_sequences_));
  }
  if (slot < 0 || slot >= kInputSlots) {
    return absl::InvalidArgumentError(absl::StrCat("cuda backend: no input slot ", slot));
  }
  graph_sequences_ = sequences;
  graph_slot_ = slot;
  graph_mode_ = true;
  return absl::OkStatus();
}

absl::Status CudaRouterBackend::WriteDecodeInputs(
    int slot, absl::Span<const int32_t> tokens, absl::Span<const int32_t> positions,
    absl::Span<const PagedKvCache::SequenceId> sequences, PagedKvCache& kv,
    absl::Span<const RowSampling> sampling) {
  const size_t n = tokens.size();
  if (slot < 0 || slot >= kInputSlots || positions.size() != n || sequences.size() != n ||
      (!sampling.empty() && sampling.size() != n) ||
      static_cast<int>(n) > graph_prepared_sequences_) {
    return absl::InvalidArgumentError("cuda backend: decode inputs do not match");
  }
  RETURN_IF_ERROR(SyncKv(kv));
  HostInputs& host = host_[slot];
  for (size_t i = 0; i < n; ++i) {
    if (static_cast<int>(kv.block_table(sequences[i]).size()) > graph_max_blocks_) {
      return absl::FailedPreconditionError("cuda backend: a sequence outgrew the decode graph");
    }
    if (tokens[i] < kPreviousGreedyToken || tokens[i] >= config_.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "token id ", tokens[i], " is outside the vocabulary [0, ", config_.vocab_size, ")"));
    }
    host.ids.data()[i] = tokens[i];
    host.positions.data()[i] = positions[i];
    host.token_seq.data()[i] = static_cast<int32_t>(i);
    host.rows.data()[i] = static_cast<int32_t>(i);
    WriteTableRow(kv, sequences[i], host.tables.data() + i * graph_max_blocks_, graph_max_blocks_);
  }
  return WriteSampling(host, sampling);
}

absl::Status CudaRouterBackend::WriteSampling(HostInputs& host,
                                              absl::Span<const RowSampling> sampling) {
  size_t entries = 0;
  for (size_t i = 0; i < static_cast<size_t>(graph_prepared_sequences_); ++i) {
    SampleParams& p = host.sampling.data()[i];
    p = SampleParams();  // temperature 0: the arg-max stands
    if (i >= sampling.size()) continue;
    const RowSampling& r = sampling[i];
    p.temperature = r.temperature;
    p.top_k = r.top_k;
    p.top_p = r.top_p;
    p.min_p = r.min_p;
    p.seed = r.seed;
    p.step = r.step;
    p.repetition_penalty = r.repetition_penalty;
    p.presence_penalty = r.presence_penalty;
    p.frequency_penalty = r.frequency_penalty;
    p.min_tokens = r.min_tokens;
    p.list_step = r.list_step;
    // The device keeps the last kTokenHistory tokens of a row: a list may not lag further.
    if (r.step < r.list_step || r.step - r.list_step > kTokenHistory) {
      return absl::InvalidArgumentError(absl::StrCat("cuda backend: a row's token list counts ",
                                                     r.list_step, " outputs, too few for step ",
                                                     r.step));
    }
    if (r.tokens == nullptr || r.tokens->empty()) continue;
    const std::vector<TransformToken>& list = *r.tokens;
    if (entries + list.size() > host.entries.size()) {
      return absl::ResourceExhaustedError(
          "cuda backend: the rows' token lists outgrew their buffer");
    }
    p.list_offset = static_cast<int32_t>(entries);
    p.list_size = static_cast<int32_t>(list.size());
    LogitEntry* out = host.entries.data() + entries;
    for (const TransformToken& t : list) {
      *out++ = LogitEntry{
          .token = t.token, .output_count = t.output_count, .bias = t.bias, .flags = t.flags};
    }
    entries += list.size();
  }
  return absl::OkStatus();
}

void CudaRouterBackend::WriteTableRow(const PagedKvCache& kv, PagedKvCache::SequenceId seq,
                                      int32_t* row, int width) const {
  const std::vector<int>& blocks = kv.block_table(seq);
  const bool wide = kv_fp8_ && kv.wide(seq);
  const int held = static_cast<int>(blocks.size());
  for (int b = 0; b < width; ++b) {
    const int32_t block = b < held ? blocks[b] : 0;
    row[b] = wide ? WideKvEntry(block) : block;
  }
}

absl::Status CudaRouterBackend::SyncKv(PagedKvCache& kv) {
  cudaStream_t stream = context_->stream();
  const size_t wanted = KvBytes(kv.active_blocks());
  // A grown pool's blocks are backed before anything is written there.
  if (wanted > kv_memory_.committed()) RETURN_IF_ERROR(kv_memory_.Commit(wanted));
  if (kv_fp8_ && kv.scales_ready() && !kv_scales_uploaded_) {
    const ModelConfig& c = config_;
    std::vector<float> scales(kv_scales_.size());
    for (int l = 0; l < c.num_layers; ++l) {
      for (int h = 0; h < c.num_kv_heads; ++h) {
        scales[(int64_t{l} * 2 + 0) * c.num_kv_heads + h] = kv.scales().k[l * c.num_kv_heads + h];
        scales[(int64_t{l} * 2 + 1) * c.num_kv_heads + h] = kv.scales().v[l * c.num_kv_heads + h];
      }
    }
    // Pageable memory: the call returns once the data is staged.
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(kv_scales_.data(), scales.data(),
                                         scales.size() * sizeof(float), cudaMemcpyHostToDevice,
                                         stream));
    kv_scales_uploaded_ = true;
  }
  RETURN_IF_ERROR(ApplyKvMoves(kv));
  if (wanted + kv_memory_.chunk_bytes() <= kv_memory_.committed()) {
    // A shrunk pool: once the moves out of its tail and every step queued before have run,
    // the tail's memory goes back to the device.
    CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
    RETURN_IF_ERROR(kv_memory_.Commit(wanted));
  }
  return absl::OkStatus();
}

absl::Status CudaRouterBackend::ApplyKvMoves(PagedKvCache& kv) {
  if (!kv.has_moves()) return absl::OkStatus();
  moves_host_.clear();
  for (const KvBlockMove& m : kv.TakeMoves()) moves_host_.push_back({m.src, m.dst, m.dst_v});
  if (kv_moves_.size() < moves_host_.size()) {
    RETURN_IF_ERROR(Allocate(kv_moves_, moves_host_.size()));
  }
  cudaStream_t stream = context_->stream();
  // Pageable memory: the call returns once the data is staged.
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(kv_moves_.data(), moves_host_.data(),
                                       moves_host_.size() * sizeof(KvMoveBlock),
                                       cudaMemcpyHostToDevice, stream));
  uint8_t* data = kv_memory_.data();
  // Runs of one kind, in order: a later move may read what an earlier one wrote.
  for (size_t begin = 0; begin < moves_host_.size();) {
    const bool widen = moves_host_[begin].dst_v >= 0;
    size_t end = begin;
    while (end < moves_host_.size() && (moves_host_[end].dst_v >= 0) == widen) ++end;
    const int count = static_cast<int>(end - begin);
    if (widen) {
      CUDA_RETURN_IF_ERROR(LaunchKvWiden(data, config_.num_layers, block_size_,
                                         config_.num_kv_heads, config_.head_dim, kv_scales_.data(),
                                         kv_moves_.data() + begin, count, stream));
    } else {
      CUDA_RETURN_IF_ERROR(LaunchKvCopyBlocks(data, kv_block_bytes_, config_.num_layers,
                                              kv_moves_.data() + begin, count, stream));
    }
    begin = end;
  }
  return absl::OkStatus();
}

absl::Status CudaRouterBackend::ReportKvRange(PagedKvCache& kv) {
  if (!kv_fp8_ || observed_tokens_ == 0) return absl::OkStatus();
  const ModelConfig& c = config_;
  std::vector<float> amax(kv_amax_.size());
  cudaStream_t stream = context_->stream();
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(amax.data(), kv_amax_.data(), amax.size() * sizeof(float),
                                       cudaMemcpyDeviceToHost, stream));
  CUDA_RETURN_IF_ERROR(cudaMemsetAsync(kv_amax_.data(), 0, amax.size() * sizeof(float), stream));
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  std::vector<float> k, v;
  for (int l = 0; l < c.num_layers; ++l) {
    const float* layer = amax.data() + int64_t{l} * 2 * c.num_kv_heads;
    k.insert(k.end(), layer, layer + c.num_kv_heads);
    v.insert(v.end(), layer + c.num_kv_heads, layer + 2 * c.num_kv_heads);
  }
  kv.ObserveKvRange(k, v, observed_tokens_);
  observed_tokens_ = 0;
  return SyncKv(kv);  // the scales, if that set them
}

const bf16* CudaRouterBackend::NextNorm(int layer) const {
  return layer + 1 < config_.num_layers ? layers_[layer + 1].input_norm : final_norm_;
}

absl::Status CudaRouterBackend::AddAndNormalize(const bf16* x, int layer, int64_t n,
                                                const uint32_t* ready_flag) {
  CUDA_RETURN_IF_ERROR(LaunchAddRmsNorm(hidden_.data(), x, NextNorm(layer), n, config_.hidden_size,
                                        static_cast<float>(config_.rms_norm_eps), normed_.data(),
                                        context_->stream(), ready_flag));
  return absl::OkStatus();
}

absl::Status CudaRouterBackend::BeginStep(absl::Span<const int32_t> ids, const BatchLayout& batch,
                                          PagedKvCache& kv) {
  if (batch.num_tokens() != static_cast<int64_t>(ids.size())) {
    return absl::InvalidArgumentError("cuda backend: the batch does not match the ids");
  }
  RETURN_IF_ERROR(Embed(ids));
  return UploadBatch(batch, kv);
}

absl::Status CudaRouterBackend::Embed(absl::Span<const int32_t> ids) {
  const int64_t n = static_cast<int64_t>(ids.size());
  if (n > options_.max_tokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("cuda backend: ", n, " tokens in a step; the limit is ", options_.max_tokens));
  }
  for (int32_t id : ids) {
    if (id < 0 || id >= config_.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "token id ", id, " is outside the vocabulary [0, ", config_.vocab_size, ")"));
    }
  }
  cudaStream_t stream = context_->stream();
  RETURN_IF_ERROR(Stage(ids.data(), ids.size(), host_inputs().ids, ids_));
  // A replay's token may be the previous replay's greedy one, left in greedy_ on the device.
  CUDA_RETURN_IF_ERROR(LaunchEmbeddingGather(embedding_, config_.vocab_size, config_.hidden_size,
                                             ids_.data(), n, hidden_.data(), stream,
                                             graph_mode_ ? greedy_.data() : nullptr));
  CUDA_RETURN_IF_ERROR(LaunchRmsNorm(hidden_.data(), layers_[0].input_norm, n, config_.hidden_size,
                                     static_cast<float>(config_.rms_norm_eps), normed_.data(),
                                     stream));
  step_tokens_ = n;
  current_layer_ = 0;
  pending_post_norm_ = -1;
  predicted_layer_ = -1;  // a prediction of a step that failed scores nothing
  return absl::OkStatus();
}

absl::Status CudaRouterBackend::UploadBatch(const BatchLayout& batch, PagedKvCache& kv) {
  const int64_t n = batch.num_tokens();
  absl::flat_hash_map<PagedKvCache::SequenceId, int32_t> row_of;
  std::vector<PagedKvCache::SequenceId> seqs;
  std::vector<int32_t> token_seq(n), positions(n), queries;
  max_context_ = 0;
  for (int64_t t = 0; t < n; ++t) {
    auto [it, inserted] = row_of.emplace(batch.sequence[t], static_cast<int32_t>(seqs.size()));
    if (inserted) seqs.push_back(batch.sequence[t]);
    if (batch.position[t] >= kv.capacity(batch.sequence[t])) {
      return absl::FailedPreconditionError(absl::StrCat("attention: position ", batch.position[t],
                                                        " is not reserved in the kv cache"));
    }
    token_seq[t] = it->second;
    if (inserted) queries.push_back(0);
    ++queries[it->second];
    positions[t] = static_cast<int32_t>(batch.position[t]);
    max_context_ = std::max(max_context_, positions[t] + 1);
  }
  one_token_per_sequence_ = static_cast<int64_t>(seqs.size()) == n;
  max_queries_per_seq_ = queries.empty() ? 1 : *std::max_element(queries.begin(), queries.end());
  if (!graph_mode_) RETURN_IF_ERROR(SyncKv(kv));  // never while a graph is captured
  observe_kv_ = kv_fp8_ && !graph_mode_ && kv.calibrating();
  if (observe_kv_) observed_tokens_ += n;
  if (static_cast<int>(seqs.size()) > options_.max_sequences) {
    return absl::InvalidArgumentError("cuda backend: too many sequences in one step");
  }
  max_blocks_per_seq_ = 1;
  for (auto seq : seqs) {
    max_blocks_per_seq_ =
        std::max(max_blocks_per_seq_, static_cast<int>(kv.block_table(seq).size()));
  }
  if (graph_mode_) {
    // The captured layout: one token per sequence, sequence i at row i.
    if (n != graph_sequences_ || !one_token_per_sequence_ ||
        max_blocks_per_seq_ > graph_max_blocks_ || max_context_ > graph_max_context_) {
      return absl::FailedPreconditionError("cuda backend: step does not fit the decode graph");
    }
    max_blocks_per_seq_ = graph_max_blocks_;
    max_context_ = graph_max_context_;
  }
  std::vector<int32_t> tables(seqs.size() * max_blocks_per_seq_, 0);
  for (size_t r = 0; r < seqs.size(); ++r) {
    WriteTableRow(kv, seqs[r], tables.data() + r * max_blocks_per_seq_, max_blocks_per_seq_);
  }
  HostInputs& host = host_inputs();
  RETURN_IF_ERROR(Stage(token_seq.data(), token_seq.size(), host.token_seq, token_seq_));
  RETURN_IF_ERROR(Stage(positions.data(), positions.size(), host.positions, positions_));
  RETURN_IF_ERROR(Stage(tables.data(), tables.size(), host.tables, block_tables_));
  return absl::OkStatus();
}

absl::Status CudaRouterBackend::Attention(int layer) {
  const ModelConfig& c = config_;
  if (c.mla()) return LatentAttention(layer);
  const LayerWeights& lw = layers_[layer];
  const int64_t n = step_tokens_;
  cudaStream_t stream = context_->stream();
  const int64_t q_dim = int64_t{c.num_heads} * c.head_dim;
  const int64_t kv_dim = int64_t{c.num_kv_heads} * c.head_dim;
  if (linear_.GemvTakes(lw.q, n) && lw.q.format == lw.k.format && lw.q.format == lw.v.format) {
    // A few tokens: q, k and v in one GEMV launch per 16 tokens (the k and v matrices alone
    // are too small to keep the GPU's memory busy).
    const DeviceWeight* w[] = {&lw.q, &lw.k, &lw.v};
    void* y[] = {q_.data(), k_.data(), v_.data()};
    CUDA_RETURN_IF_ERROR(LaunchGemvMulti(w, y, 3, normed_.data(), n, OutType::kBf16, stream));
  } else {
    RETURN_IF_ERROR(linear_.Run(lw.q, normed_.data(), n, q_.data(), OutType::kBf16));
    RETURN_IF_ERROR(linear_.Run(lw.k, normed_.data(), n, k_.data(), OutType::kBf16));
    RETURN_IF_ERROR(linear_.Run(lw.v, normed_.data(), n, v_.data(), OutType::kBf16));
  }
  QkRopeParams rope;
  rope.num_heads = c.num_heads;
  rope.num_kv_heads = c.num_kv_heads;
  rope.head_dim = c.head_dim;
  rope.rope_dim = c.RopeDim();
  rope.q_stride = q_dim;
  rope.k_stride = kv_dim;
  rope.inv_freq = inv_freq_;
  rope.attention_scaling = attention_scaling_;
  rope.q_norm = lw.q_norm;
  rope.k_norm = lw.k_norm;
  rope.eps = static_cast<float>(c.rms_norm_eps);

  const PagedKvLayer cache = KvLayer(layer);
  const TokenBatch tokens{token_seq_.data(), positions_.data(), n};

  PagedAttentionParams params;
  params.num_heads = c.num_heads;
  params.num_kv_heads = c.num_kv_heads;
  params.head_dim = c.head_dim;
  params.q_stride = q_dim;
  params.out_stride = q_dim;
  params.sliding_window = c.sliding_window[layer];
  params.sinks = lw.sinks;
  params.max_context = max_context_;
  params.max_queries_per_seq = max_queries_per_seq_;
  const PagedAttentionPlan plan = PlanPagedAttention(n, params, context_->num_sms());
  // The fused decode needs every token's only new key to be its own (one token a sequence);
  // taken for small steps only, where it was measured.
  // Cluster plans share one zeroed workspace and graphs theirs, both sized up front; an eager
  // split plan grows its own.
  DeviceBuffer<uint8_t>& workspace = plan.cluster  ? cluster_workspace_
                                     : graph_mode_ ? graph_attention_workspace_
                                                   : attention_workspace_;
  if (plan.workspace_bytes > workspace.size()) {
    if (plan.cluster || graph_mode_) {
      return absl::InternalError("cuda backend: attention workspace too small");
    }
    RETURN_IF_ERROR(Allocate(attention_workspace_, plan.workspace_bytes));
  }
  if (plan.cluster && n <= kGemvMaxTokens && one_token_per_sequence_ && !observe_kv_ &&
      c.RopeDim() == c.head_dim) {
    // Decode: q/k norm + rope and the cache append happen inside the attention kernel.
    CUDA_RETURN_IF_ERROR(LaunchPagedDecodeWithRope(q_.data(), k_.data(), v_.data(), kv_dim, tokens,
                                                   cache, params, rope, plan, workspace.data(),
                                                   attn_.data(), stream));
  } else {
    CUDA_RETURN_IF_ERROR(
        LaunchQkNormRope(q_.data(), k_.data(), n, positions_.data(), rope, stream));
    if (observe_kv_) {
      CUDA_RETURN_IF_ERROR(
          LaunchKvAbsMax(k_.data(), kv_dim, v_.data(), kv_dim, n, c.num_kv_heads, c.head_dim,
                         kv_amax_.data() + int64_t{layer} * 2 * c.num_kv_heads, stream));
    }
    CUDA_RETURN_IF_ERROR(
        LaunchPagedKvAppend(k_.data(), kv_dim, v_.data(), kv_dim, tokens, cache, stream));
    CUDA_RETURN_IF_ERROR(LaunchPagedAttention(q_.data(), tokens, cache, params, plan,
                                              workspace.data(), attn_.data(), stream));
  }
  return FinishAttention(layer);
}

PagedKvLayer CudaRouterBackend::KvLayer(int layer) const {
  const ModelConfig& c = config_;
  PagedKvLayer cache;
  cache.data = reinterpret_cast<bf16*>(kv_memory_.data()) + layer * (kv_block_bytes_ / 2);
  cache.block_stride = kv_block_bytes_ * c.num_layers;
  cache.block_tables = block_tables_.data();
  cache.max_blocks_per_seq = max_blocks_per_seq_;
  cache.block_size = block_size_;
  cache.num_kv_heads = c.num_kv_heads;
  cache.head_dim = c.KvHeadDim();
  if (kv_fp8_) {
    cache.fp8 = true;
    cache.k_scale = kv_scales_.data() + int64_t{layer} * 2 * c.num_kv_heads;
    cache.v_scale = cache.k_scale + c.num_kv_heads;
  }
  return cache;
}

absl::Status CudaRouterBackend::FinishAttention(int layer) {
  const int64_t n = step_tokens_;
  RETURN_IF_ERROR(linear_.Run(layers_[layer].o, attn_.data(), n, proj_.data(), OutType::kBf16));
  current_layer_ = layer;
  if (FusesNormAndGate(layer, n)) {
    pending_post_norm_ = layer;  // PrepareFfn's kernel adds and normalizes
    return absl::OkStatus();
  }
  return ApplyPostNorm(layer);
}

absl::Status CudaRouterBackend::ApplyPostNorm(int layer) {
  CUDA_RETURN_IF_ERROR(LaunchAddRmsNorm(
      hidden_.data(), proj_.data(), layers_[layer].post_norm, step_tokens_, config_.hidden_size,
      static_cast<float>(config_.rms_norm_eps), normed_.data(), context_->stream()));
  return absl::OkStatus();
}

MoeGateParams CudaRouterBackend::GateParams(int layer, float temperature) const {
  MoeGateParams gate;
  gate.num_experts = config_.num_experts;
  gate.top_k = config_.top_k;
  gate.temperature = temperature;
  // The model's scoring (strata::GateScoring) as the kernels' (gpu::GateScoring).
  switch (config_.gate_scoring) {
    case strata::GateScoring::kTopKThenSoftmax:
      gate.scoring = gpu::GateScoring::kTopKThenSoftmax;
      break;
    case strata::GateScoring::kSigmoidGrouped:
      gate.scoring = gpu::GateScoring::kSigmoidGrouped;
      gate.correction_bias = layers_[layer].correction_bias;
      gate.num_groups = config_.num_expert_groups;
      gate.top_k_groups = config_.top_k_groups;
      gate.scaling = static_cast<float>(config_.routed_scaling_factor);
      break;
    default:
      gate.scoring = gpu::GateScoring::kSoftmaxThenTopK;
  }
  gate.renormalize = config_.norm_topk_prob;
  return gate;
}

AddNormGateArgs CudaRouterBackend::NormGateArgs(int layer, int64_t n) {
  const DeviceWeight& router = layers_[layer].router;
  AddNormGateArgs args;
  args.residual = hidden_.data();
  args.x = proj_.data();
  args.norm_weight = layers_[layer].post_norm;
  args.eps = static_cast<float>(config_.rms_norm_eps);
  args.normed = normed_.data();
  args.gate = static_cast<const bf16*>(router.data);
  args.gate_bias = router.bias;
  args.logits = gate_logits_.data();
  args.expert_ids = routing_ids_.data();
  args.weights = routing_weights_.data();
  args.blocks_done = gate_blocks_done_.data();
  args.n = n;
  args.hidden = config_.hidden_size;
  return args;
}

bool CudaRouterBackend::FusesNormAndGate(int layer, int64_t n) {
  // What the launch would refuse is refused here: PrepareFfn has no way back once the add +
  // norm is left to it.
  const DeviceWeight& router = layers_[layer].router;
  return config_.layer_is_moe[layer] && router.format == WeightFormat::kBf16 &&
         router.in == config_.hidden_size && router.out == config_.num_experts &&
         AddNormGateAccepts(NormGateArgs(layer, n), GateParams(layer, 1.0f));
}

absl::Status CudaRouterBackend::PrepareFfn(int layer, float temperature, Tensor& ffn_input,
                                           RoutingTable& routing) {
  // The add + norm Attention left for this layer's fused gate, or for nobody (another layer
  // asked, or the temperature is bad): then on its own, so the residual is whole either way.
  const bool fused = pending_post_norm_ == layer && temperature > 0.0f;
  if (pending_post_norm_ >= 0 && !fused) RETURN_IF_ERROR(ApplyPostNorm(pending_post_norm_));
  pending_post_norm_ = -1;
  if (!(temperature > 0.0f)) return absl::InvalidArgumentError("gate temperature must be positive");
  const ModelConfig& c = config_;
  const int64_t n = step_tokens_;
  ffn_input = Tensor::DeviceView(normed_.data(), n, c.hidden_size, keep_alive_);
  routing.expert.clear();
  routing.weight.clear();
  routing.tokens = n;
  if (!c.layer_is_moe[layer]) {
    routing.top_k = 0;
    routing.device_expert = nullptr;
    routing.device_weight = nullptr;
    return absl::OkStatus();
  }
  const MoeGateParams gate = GateParams(layer, temperature);
  if (fused) {
    AddNormGateArgs args = NormGateArgs(layer, n);
    if (hand_off_source_ != nullptr) {
      hand_off_source_->TakeHandOff(layer, n, args.hand_off);  // or leaves it inactive
    }
    CUDA_RETURN_IF_ERROR(LaunchAddNormGate(args, gate, context_->stream()));
  } else {
    RETURN_IF_ERROR(
        linear_.Run(layers_[layer].router, normed_.data(), n, gate_logits_.data(), OutType::kF32));
    CUDA_RETURN_IF_ERROR(LaunchMoeGate(gate_logits_.data(), n, gate, routing_ids_.data(),
                                       routing_weights_.data(), context_->stream()));
  }
  routing.top_k = c.top_k;
  routing.device_expert = routing_ids_.data();
  routing.device_weight = routing_weights_.data();
  if (predicted_layer_ == layer) {
    CUDA_RETURN_IF_ERROR(LaunchScoreRoutingPrediction(predicted_ids_.data(), routing_ids_.data(), n,
                                                      c.top_k, prediction_counts_.data(),
                                                      context_->stream()));
    predicted_layer_ = -1;
  }
  return absl::OkStatus();
}

absl::Status CudaRouterBackend::RunSingleExpert(const ExpertWeightTable& table, const bf16* x,
                                                int64_t n, bf16* out) {
  const ExpertWorkspace ws =
      CarveExpertWorkspace(ffn_workspace_.data(), n, 1, table.hidden, table.intermediate);
  CUDA_RETURN_IF_ERROR(LaunchGroupedExperts(x, single_ids_.data(), single_weights_.data(), n, 1,
                                            table, GluParams{}, ws, out, context_->stream()));
  return absl::OkStatus();
}

absl::Status CudaRouterBackend::DenseFfn(int layer) {
  const LayerWeights& lw = layers_[layer];
  if (!lw.has_ffn) return absl::OkStatus();
  const int64_t n = step_tokens_;
  RETURN_IF_ERROR(RunSingleExpert(lw.ffn, normed_.data(), n, ffn_out_.data()));
  if (!config_.layer_is_moe[layer]) return AddAndNormalize(ffn_out_.data(), layer, n);
  // The shared expert joins the residual now; the routed experts' sum follows in Combine.
  CUDA_RETURN_IF_ERROR(LaunchSharedExpertGateAdd(normed_.data(), lw.shared_gate, ffn_out_.data(), n,
                                                 config_.hidden_size, hidden_.data(),
                                                 context_->stream()));
  return absl::OkStatus();
}

absl::Status CudaRouterBackend::Combine(const Tensor& partial, const uint32_t* ready_flag) {
  if (partial.device() != Device::kCuda || partial.rows() != step_tokens_) {
    return absl::InvalidArgumentError("combine: the partial result is not this step's, on device");
  }
  return AddAndNormalize(static_cast<const bf16*>(partial.device_data()), current_layer_,
                         step_tokens_, ready_flag);
}

absl::Status CudaRouterBackend::PredictRouting(int layer, float temperature,
                                               RoutingTable& predicted) {
  const ModelConfig& c = config_;
  if (layer < 0 || layer >= c.num_layers || !c.layer_is_moe[layer]) {
    return absl::InvalidArgumentError(
        absl::StrCat("predict routing: layer ", layer, " routes nothing"));
  }
  predicted.expert.clear();
  predicted.weight.clear();
  predicted.top_k = c.top_k;
  predicted.tokens = 0;
  predicted.device_expert = nullptr;
  predicted.device_weight = nullptr;
  if (graph_mode_) return absl::OkStatus();
  const int64_t n = step_tokens_;
  cudaStream_t stream = context_->stream();
  // hidden_ holds the residual after the layer before (Combine added its experts): `layer`'s
  // post-attention norm and gate over it, without its attention.
  CUDA_RETURN_IF_ERROR(LaunchRmsNorm(hidden_.data(), layers_[layer].post_norm, n, c.hidden_size,
                                     static_cast<float>(c.rms_norm_eps), predict_normed_.data(),
                                     stream));
  RETURN_IF_ERROR(linear_.Run(layers_[layer].router, predict_normed_.data(), n, gate_logits_.data(),
                              OutType::kF32));
  CUDA_RETURN_IF_ERROR(LaunchMoeGate(gate_logits_.data(), n, GateParams(layer, temperature),
                                     predicted_ids_.data(), predicted_weights_.data(), stream));
  predicted_layer_ = layer;
  predicted.tokens = n;
  predicted.device_expert = predicted_ids_.data();
  predicted.device_weight = predicted_weights_.data();
  return absl::OkStatus();
}

absl::Status CudaRouterBackend::ReadPredictedRouting(RoutingTable& host) {
  if (predicted_layer_ < 0 || graph_mode_) {
    return absl::FailedPreconditionError("no routing predicted on the device in this step");
  }
  host.Resize(step_tokens_, config_.top_k);
  cudaStream_t stream = context_->stream();
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host.expert.data(), predicted_ids_.data(),
                                       host.expert.size() * sizeof(int32_t), cudaMemcpyDeviceToHost,
                                       stream));
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  return absl::OkStatus();
}

absl::StatusOr<int64_t> CudaRouterBackend::ResizeKv(PagedKvCache& kv, int blocks) {
  if (blocks < 1 || blocks > kv.options().num_blocks) return kv.Resize(blocks);  // its error
  // Growing: the memory is mapped before a block of it is handed out.
  const size_t wanted = KvBytes(blocks);
  if (wanted > kv_memory_.committed()) {
    if (absl::Status grown = kv_memory_.Commit(wanted); !grown.ok()) {
      kv_memory_.Commit(KvBytes(kv.active_blocks())).IgnoreError();  // back as it was
      return grown;
    }
  }
  ASSIGN_OR_RETURN(const int64_t moved, kv.Resize(blocks));
  // Shrinking: the moves run, then the tail goes back to the device (SyncKv), before anyone is
  // told the memory is free.
  RETURN_IF_ERROR(SyncKv(kv));
  return moved;
}

RouterBackend::PredictionCounts CudaRouterBackend::DevicePredictionCounts() const {
  // Pinned memory the stream copies into after each step; read without waiting for it.
  const volatile unsigned long long* c = prediction_counts_host_.data();
  return {c[0], c[1], c[2]};
}

absl::Status CudaRouterBackend::Logits(absl::Span<const int64_t> rows, Tensor& logits) {
  const int64_t r = static_cast<int64_t>(rows.size());
  host_ints_.resize(r);
  for (int64_t i = 0; i < r; ++i) {
    if (rows[i] < 0 || rows[i] >= step_tokens_) {
      return absl::InvalidArgumentError("logits: row outside the hidden state");
    }
    host_ints_[i] = static_cast<int32_t>(rows[i]);
  }
  cudaStream_t stream = context_->stream();
  RETURN_IF_ERROR(Stage(host_ints_.data(), host_ints_.size(), host_inputs().rows, rows_));
  // The final norm is already applied: normed_ holds it after the last layer.
  CUDA_RETURN_IF_ERROR(LaunchEmbeddingGather(normed_.data(), step_tokens_, config_.hidden_size,
                                             rows_.data(), r, gathered_.data(), stream));
  RETURN_IF_ERROR(linear_.Run(lm_head_, gathered_.data(), r, logits_.data(), OutType::kF32));
  if (graph_mode_) {
    // Captured: only the tokens cross to the host (4 bytes a row instead of the 600 KB
    // row of a 150k vocabulary); the caller synchronizes after the replay.
    if (r != graph_sequences_) {
      return absl::FailedPreconditionError("cuda backend: graph steps have a row per sequence");
    }
    // Rows with transforms have them applied first (their lists read from pinned memory);
    // rows that sample draw over their arg-max, greedy rows leave at once; each row's token
    // goes into its history for the transforms of the steps launched behind this one.
    RETURN_IF_ERROR(Stage(host_inputs().sampling.data(), static_cast<size_t>(r),
                          host_inputs().sampling, sampling_));
    CUDA_RETURN_IF_ERROR(LaunchApplyLogitTransforms(logits_.data(), r, config_.vocab_size,
                                                    sampling_.data(), host_inputs().entries.data(),
                                                    token_history_.data(), stream));
    CUDA_RETURN_IF_ERROR(LaunchArgmax(logits_.data(), r, config_.vocab_size, argmax_scratch_.data(),
                                      greedy_.data(), stream));
    CUDA_RETURN_IF_ERROR(LaunchSample(logits_.data(), r, config_.vocab_size, sampling_.data(),
                                      sample_scratch_.data(), greedy_.data(), stream,
                                      /*keep_greedy_rows=*/true, GetTunables().nucleus_draw_first));
    CUDA_RETURN_IF_ERROR(
        LaunchRecordTokens(greedy_.data(), r, sampling_.data(), token_history_.data(), stream));
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host_inputs().greedy.data(), greedy_.data(),
                                         static_cast<size_t>(r) * sizeof(int32_t),
                                         cudaMemcpyDeviceToHost, stream));
    return absl::OkStatus();
  }
  // The prediction counts of this (eager) step, in the synchronize below.
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(prediction_counts_host_.data(), prediction_counts_.data(),
                                       3 * sizeof(unsigned long long), cudaMemcpyDeviceToHost,
                                       stream));
  logits.Resize(r, config_.vocab_size);
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(logits.data(), logits_.data(),
                                       static_cast<size_t>(r * config_.vocab_size) * sizeof(float),
                                       cudaMemcpyDeviceToHost, stream));
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  return absl::OkStatus();
}

absl::StatusOr<const float*> CudaRouterBackend::CopyDecodeLogits(absl::Span<const int64_t> rows) {
  cudaStream_t stream = context_->stream();
  const int64_t vocab = config_.vocab_size;
  for (int64_t r : rows) {
    if (r < 0 || r >= graph_prepared_sequences_) {
      return absl::OutOfRangeError("cuda backend: no such decode logits row");
    }
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(pinned_logits_.data() + r * vocab,
                                         logits_.data() + r * vocab, vocab * sizeof(float),
                                         cudaMemcpyDeviceToHost, stream));
  }
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  return pinned_logits_.data();
}

}  // namespace strata::gpu
