#include "services/expert-store/expert_store.h"

#include <numa.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <random>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/shm/process_liveness.h"
#include "common/util/file_stamp.h"
#include "common/util/status_macros.h"
#include "services/expert-store/fast_hash.h"
#include "services/expert-store/store_meta.h"

namespace strata {

namespace {

constexpr uint64_t kTensorAlignment = 256;  // keeps device copies and vector loads aligned

uint64_t AlignUp(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

struct TensorSource {
  const char* name;
  const void* data;
  DType dtype;
  int64_t out, in;  // in == 0 for vectors
  int64_t out_stride, in_stride;
};

// The tensors of one expert, whichever are present.
std::vector<TensorSource> ExpertTensors(const FfnWeights& f) {
  std::vector<TensorSource> t;
  auto matrix = [&](const char* name, const WeightMatrix& m) {
    t.push_back({name, m.data, m.dtype, m.out, m.in, m.out_stride, m.in_stride});
  };
  auto vector = [&](const char* name, const WeightVector& v) {
    if (v.present()) t.push_back({name, v.data, v.dtype, v.size, 0, v.stride, 0});
  };
  // FP8 matrices' per-row float32 scales travel as vectors, block scales as their
  // [grid rows, grid cols] matrix (an expert is a whole tensor, so its blocks start at its
  // element (0, 0); workers describe them again over their mapping, MappedExperts::Map).
  auto scale = [&](const char* name, const WeightMatrix& m) {
    if (m.scale != nullptr) t.push_back({name, m.scale, DType::kF32, m.out, 0, 1, 0});
  };
  auto block_scales = [&](const char* name, const WeightMatrix& m) {
    if (!m.blocks.present()) return;
    const Fp8BlockScales& b = m.blocks;
    t.push_back({name, b.data, DType::kF32, b.grid_rows(), b.grid_cols(), b.grid_cols(), 1});
  };
  matrix("gate", f.gate);
  matrix("up", f.up);
  matrix("down", f.down);
  vector("gate_bias", f.gate_bias);
  vector("up_bias", f.up_bias);
  vector("down_bias", f.down_bias);
  scale("gate_scale", f.gate);
  scale("up_scale", f.up);
  scale("down_scale", f.down);
  block_scales("gate_block_scales", f.gate);
  block_scales("up_block_scales", f.up);
  block_scales("down_block_scales", f.down);
  return t;
}

uint64_t TensorBytes(const TensorSource& t) {
  return static_cast<uint64_t>(t.out) * std::max<int64_t>(t.in, 1) * DTypeSize(t.dtype);
}

// Copies a possibly strided tensor into contiguous row-major memory.
void CopyContiguous(const TensorSource& t, uint8_t* dst) {
  const size_t elem = DTypeSize(t.dtype);
  const auto* src = static_cast<const uint8_t*>(t.data);
  if (t.in == 0) {
    for (int64_t o = 0; o < t.out; ++o)
      std::memcpy(dst + o * elem, src + o * t.out_stride * elem, elem);
    return;
  }
  for (int64_t o = 0; o < t.out; ++o) {
    uint8_t* row = dst + o * t.in * elem;
    if (t.in_stride == 1) {
      std::memcpy(row, src + o * t.out_stride * elem, t.in * elem);
    } else {
      for (int64_t i = 0; i < t.in; ++i) {
        std::memcpy(row + i * elem, src + (o * t.out_stride + i * t.in_stride) * elem, elem);
      }
    }
  }
}

std::string MetaName(const std::string& prefix) { return prefix + "-experts-meta"; }

int ChecksumThreads() { return std::max(1, static_cast<int>(std::thread::hardware_concurrency())); }

double MillisecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
      .count();
}

void Say(const ExpertStoreOptions& options, const std::string& message) {
  if (options.log) options.log(message);
}

// Layer `layer` expert `e`'s tensor `t` in the layout, at `offset` of segment `segment`.
void AddTensorInfo(int layer, int e, const TensorSource& t, int segment, uint64_t offset,
                   v1::ExpertLayout& layout) {
  v1::ExpertTensorInfo* info = layout.add_tensors();
  info->set_layer(layer);
  info->set_expert(e);
  info->set_tensor(t.name);
  info->set_segment(segment);
  info->set_offset(offset);
  info->set_dtype(std::string(DTypeName(t.dtype)));
  info->add_shape(t.out);
  if (t.in > 0) info->add_shape(t.in);
}

// The name of the store's segment for NUMA node `node`: a new generation, new names, so a
// rebuilt store never meets a name left by an earlier one.
std::string SegmentName(const std::string& prefix, uint64_t generation, int node) {
  return absl::StrFormat("%s-experts-%016x-%d", prefix, generation, node);
}

// Where every expert tensor of `model` goes: expert e of every layer on node e % num_nodes.
// Everything of the layout but the model directory.
v1::ExpertLayout PlanLayout(const Model& model, const ExpertStoreOptions& options,
                            uint64_t generation) {
  const bool numa = options.bind_numa && numa_available() >= 0;
  const int num_nodes = numa ? std::max(1, numa_num_configured_nodes()) : 1;
  v1::ExpertLayout layout;
  std::vector<uint64_t> segment_bytes(num_nodes, 0);
  for (int layer = 0; layer < model.config.num_layers; ++layer) {
    const auto& experts = model.weights.layers[layer].experts;
    for (int e = 0; e < static_cast<int>(experts.size()); ++e) {
      const int node = e % num_nodes;
      for (const TensorSource& t : ExpertTensors(experts[e])) {
        AddTensorInfo(layer, e, t, node, segment_bytes[node], layout);
        segment_bytes[node] = AlignUp(segment_bytes[node] + TensorBytes(t), kTensorAlignment);
      }
    }
  }
  for (int node = 0; node < num_nodes; ++node) {
    v1::SharedSegmentInfo* info = layout.add_segments();
    info->set_name(SegmentName(options.segment_prefix, generation, node));
    info->set_bytes(std::max<uint64_t>(segment_bytes[node], 4096));
    info->set_numa_node(numa ? node : -1);
  }
  layout.set_generation(generation);
  return layout;
}

// The meta of the store under `name`: NotFound when there is none, FailedPrecondition when
// the name is not this user's own (SharedSegment: it is never used, nor removed), DataLoss
// when it is not a complete store.
absl::StatusOr<StoreMeta> ReadMeta(const std::string& name) {
  absl::StatusOr<SharedSegment> segment = SharedSegment::Open(name, /*read_only=*/true);
  if (absl::IsNotFound(segment.status())) return segment.status();
  if (absl::IsPermissionDenied(segment.status())) {
    return absl::FailedPreconditionError(
        absl::StrCat("the expert store name is taken: ", segment.status().message()));
  }
  if (!segment.ok()) {
    return absl::DataLossError(absl::StrCat("cannot map ", name, ": ", segment.status().message()));
  }
  return DecodeMeta(segment->data(), segment->size());
}

// Two strata-expert-store processes must never share a store: each removes it when it stops.
absl::Status CheckOwnerGone(const StoreMeta& meta, const std::string& prefix) {
  if (ProcessAlive(meta.owner_pid, meta.owner_start_time)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the expert store \"", prefix, "\" belongs to strata-expert-store pid ", meta.owner_pid,
        ", which is running; stop it or use another --segment-prefix"));
  }
  return absl::OkStatus();
}

// Removes the store a gone strata-expert-store left under `prefix` (its segments, then its meta);
// FailedPrecondition when its owner still runs. The segments are this user's own found under
// the prefix, never names read from the meta.
absl::Status RemoveGoneStore(const std::string& prefix) {
  const std::string meta_name = MetaName(prefix);
  absl::StatusOr<StoreMeta> old = ReadMeta(meta_name);
  if (absl::IsFailedPrecondition(old.status())) return old.status();
  if (old.ok()) RETURN_IF_ERROR(CheckOwnerGone(*old, prefix));
  for (const std::string& name : SharedSegment::ListOwned(prefix + "-experts-")) {
    if (name != meta_name) SharedSegment::Remove(name).IgnoreError();
  }
  SharedSegment::Remove(meta_name).IgnoreError();
  return absl::OkStatus();
}

bool Contiguous(const TensorSource& t) {
  return t.in == 0 ? t.out_stride == 1 : t.in_stride == 1 && t.out_stride == t.in;
}

// The layout's segment for checkpoint file `path` (absolute), added with the file's size and
// modification time the first time it is asked for.
absl::StatusOr<int> FileSegment(const std::string& path, v1::ExpertLayout& layout,
                                absl::flat_hash_map<std::string, int>& segment_of) {
  if (const auto it = segment_of.find(path); it != segment_of.end()) return it->second;
  ASSIGN_OR_RETURN(const FileStamp stamp, StampFile(path));
  v1::SharedSegmentInfo* info = layout.add_segments();
  info->set_name(path);
  info->set_file_path(path);
  info->set_bytes(stamp.bytes);
  info->set_file_mtime_ns(stamp.mtime_ns);
  info->set_numa_node(-1);
  return segment_of[path] = layout.segments_size() - 1;
}

// Why a store built for `have` cannot serve `want`; empty when it can.
std::string ModelMismatch(const ModelIdentity& have, const ModelIdentity& want) {
  if (have.dir != want.dir) return absl::StrCat("it holds the model in ", have.dir);
  if (have.config_checksum != want.config_checksum) return "config.json changed since it was built";
  if (have.checkpoint_fingerprint != want.checkpoint_fingerprint) {
    return "the checkpoint files changed since it was built";
  }
  return "";
}

std::string LayoutMismatch(const v1::ExpertLayout& have, const v1::ExpertLayout& want) {
  if (have.segments_size() != want.segments_size()) {
    return absl::StrCat("it has ", have.segments_size(), " segment(s) where this host needs ",
                        want.segments_size());
  }
  for (int i = 0; i < want.segments_size(); ++i) {
    const auto &h = have.segments(i), &w = want.segments(i);
    if (h.name() != w.name() || h.bytes() != w.bytes() || h.numa_node() != w.numa_node()) {
      return absl::StrCat("its segment ", h.name(), " (", h.bytes(), " bytes, NUMA node ",
                          h.numa_node(), ") is not this model's");
    }
  }
  if (have.tensors_size() != want.tensors_size()) {
    return absl::StrCat("it lays out ", have.tensors_size(), " expert tensors, the model has ",
                        want.tensors_size());
  }
  for (int i = 0; i < want.tensors_size(); ++i) {
    const v1::ExpertTensorInfo& t = want.tensors(i);
    if (have.tensors(i).SerializeAsString() != t.SerializeAsString()) {
      return absl::StrCat("layer ", t.layer(), " expert ", t.expert(), " tensor ", t.tensor(),
                          " is laid out differently");
    }
  }
  return "";
}

}  // namespace

// The meta goes first, so that a stop cut short never leaves a store that looks complete.
ExpertStore::~ExpertStore() { meta_.reset(); }

absl::StatusOr<std::unique_ptr<ExpertStore>> ExpertStore::Build(const Model& model,
                                                                const ExpertStoreOptions& options) {
  if (options.in_place) return MapInPlace(model, options);
  const auto start = std::chrono::steady_clock::now();
  const std::string meta_name = MetaName(options.segment_prefix);
  // Replace what a gone strata-expert-store left under this prefix.
  RETURN_IF_ERROR(RemoveGoneStore(options.segment_prefix));
  ASSIGN_OR_RETURN(const ModelIdentity identity, IdentifyModel(model.dir));

  std::unique_ptr<ExpertStore> store(new ExpertStore());
  std::random_device rd;
  uint64_t generation = 0;
  while (generation == 0) generation = (static_cast<uint64_t>(rd()) << 32) | rd();
  store->layout_ = PlanLayout(model, options, generation);
  store->layout_.set_model_dir(model.dir);
  for (const v1::SharedSegmentInfo& info : store->layout_.segments()) {
    // Not reserved: the pages come on first touch, after they are bound to the node.
    absl::StatusOr<SharedSegment> segment =
        SharedSegment::Create(info.name(), info.bytes(), /*reserve=*/false);
    if (!segment.ok()) {
      return absl::Status(segment.status().code(),
                          absl::StrCat("expert store: ", segment.status().message()));
    }
    if (info.numa_node() >= 0) numa_tonode_memory(segment->data(), info.bytes(), info.numa_node());
    store->segments_.push_back(*std::move(segment));
  }

  // Copy, tensor by tensor, in layout order.
  const ModelConfig& c = model.config;
  int index = 0;
  for (int layer = 0; layer < c.num_layers; ++layer) {
    const auto& experts = model.weights.layers[layer].experts;
    for (const FfnWeights& expert : experts) {
      for (const TensorSource& t : ExpertTensors(expert)) {
        const v1::ExpertTensorInfo& info = store->layout_.tensors(index++);
        uint8_t* base = store->segments_[info.segment()].data();
        CopyContiguous(t, base + info.offset());
        store->bytes_copied_ += TensorBytes(t);
      }
    }
    if (options.on_progress) options.on_progress(layer, c.num_layers, store->bytes_copied_);
  }

  // The meta last: it is what makes the store adoptable.
  const auto checksum_start = std::chrono::steady_clock::now();
  StoreMeta meta;
  meta.generation = generation;
  meta.model = identity;
  meta.layout = store->layout_;
  meta.owner_pid = ::getpid();
  meta.owner_start_time = ProcessStartTime(::getpid());
  for (int i = 0; i < store->layout_.segments_size(); ++i) {
    meta.segment_checksums.push_back(ChunkedChecksum(
        store->segments_[i].data(), store->layout_.segments(i).bytes(), ChecksumThreads()));
  }
  const double checksum_ms = MillisecondsSince(checksum_start);
  const std::string encoded = EncodeMeta(meta);
  absl::StatusOr<SharedSegment> meta_segment = SharedSegment::Create(meta_name, encoded.size());
  if (!meta_segment.ok()) {
    return absl::Status(meta_segment.status().code(),
                        absl::StrCat("expert store meta: ", meta_segment.status().message()));
  }
  store->meta_ = std::make_unique<SharedSegment>(*std::move(meta_segment));
  CommitMeta(encoded, store->meta_->data());
  Say(options,
      absl::StrFormat("built %d segment(s), generation %016x: copied %.1f MiB from the "
                      "checkpoint in %.0f ms (checksums %.0f ms)",
                      store->layout_.segments_size(), generation, store->bytes_copied_ / 1048576.0,
                      MillisecondsSince(start), checksum_ms));
  return store;
}

absl::StatusOr<std::unique_ptr<ExpertStore>> ExpertStore::Attach(
    const Model& model, const ExpertStoreOptions& options) {
  if (options.in_place) return MapInPlace(model, options);
  const auto start = std::chrono::steady_clock::now();
  const std::string meta_name = MetaName(options.segment_prefix);
  absl::StatusOr<StoreMeta> meta = ReadMeta(meta_name);
  if (absl::IsNotFound(meta.status())) return Build(model, options);
  if (absl::IsFailedPrecondition(meta.status())) return meta.status();
  if (meta.ok()) RETURN_IF_ERROR(CheckOwnerGone(*meta, options.segment_prefix));

  // Why the store found cannot be adopted; empty once adopted.
  std::string why;
  std::unique_ptr<ExpertStore> store(new ExpertStore());
  uint64_t checked = 0;
  if (!meta.ok()) {
    why = std::string(meta.status().message());
  } else {
    ASSIGN_OR_RETURN(const ModelIdentity identity, IdentifyModel(model.dir));
    why = ModelMismatch(meta->model, identity);
    // The names too: only segments this store would have made under its prefix are opened.
    if (why.empty()) {
      why = LayoutMismatch(meta->layout, PlanLayout(model, options, meta->generation));
    }
  }
  // Read-only: nothing writes the data once it is built.
  for (int i = 0; why.empty() && i < meta->layout.segments_size(); ++i) {
    const v1::SharedSegmentInfo& info = meta->layout.segments(i);
    // Not MAP_POPULATE: the checksum threads fault the pages in, in parallel (faster).
    absl::StatusOr<SharedSegment> segment = SharedSegment::Open(info.name(), /*read_only=*/true);
    if (!segment.ok()) {
      why = absl::StrCat("cannot map it: ", segment.status().message());
      break;
    }
    segment->set_remove_on_destroy(true);  // owned from here: removed on mismatch
    store->segments_.push_back(*std::move(segment));
    if (store->segments_.back().size() < info.bytes()) {
      why = absl::StrCat("segment ", info.name(), " is shorter than its layout says");
    } else if (ChunkedChecksum(store->segments_.back().data(), info.bytes(), ChecksumThreads()) !=
               meta->segment_checksums[i]) {
      why = absl::StrCat("the data of segment ", info.name(), " does not match its checksum");
    }
    checked += info.bytes();
  }
  if (why.empty()) {
    absl::StatusOr<SharedSegment> meta_segment = SharedSegment::Open(meta_name);
    if (meta_segment.ok()) {
      meta_segment->set_remove_on_destroy(true);
      store->meta_ = std::make_unique<SharedSegment>(*std::move(meta_segment));
      SetMetaOwner(store->meta_->data(), ::getpid(), ProcessStartTime(::getpid()));
    } else {
      why = absl::StrCat("cannot map its meta: ", meta_segment.status().message());
    }
  }
  if (!why.empty()) {
    Say(options, absl::StrCat("not re-attaching to the expert store \"", options.segment_prefix,
                              "\": ", why, "; building it again"));
    store.reset();  // removes what it had opened
    return Build(model, options);
  }
  store->layout_ = std::move(meta->layout);
  store->reattached_ = true;
  Say(options, absl::StrFormat("re-attached to %d segment(s), generation %016x (checked %.1f MiB "
                               "in %.0f ms)",
                               store->layout_.segments_size(), store->layout_.generation(),
                               checked / 1048576.0, MillisecondsSince(start)));
  return store;
}

absl::StatusOr<std::unique_ptr<ExpertStore>> ExpertStore::MapInPlace(
    const Model& model, const ExpertStoreOptions& options) {
  RETURN_IF_ERROR(RemoveGoneStore(options.segment_prefix));
  ASSIGN_OR_RETURN(const ModelIdentity identity, IdentifyModel(model.dir));
  std::unique_ptr<ExpertStore> store(new ExpertStore());
  v1::ExpertLayout& layout = store->layout_;
  absl::flat_hash_map<std::string, int> segment_of;  // file path -> segment index
  uint64_t mapped = 0;
  for (int layer = 0; layer < model.config.num_layers; ++layer) {
    const auto& experts = model.weights.layers[layer].experts;
    for (int e = 0; e < static_cast<int>(experts.size()); ++e) {
      for (const TensorSource& t : ExpertTensors(experts[e])) {
        if (!Contiguous(t)) {
          return absl::FailedPreconditionError(absl::StrCat(
              "the in-place expert store needs contiguous expert tensors; layer ", layer,
              " expert ", e, " tensor ", t.name,
              " is strided in the checkpoint (gpt-oss interleaves gate and up): copy it"));
        }
        const uint64_t bytes = TensorBytes(t);
        absl::StatusOr<std::pair<std::string, uint64_t>> found =
            model.checkpoint->Locate(t.data, bytes);
        if (!found.ok()) {
          return absl::FailedPreconditionError(absl::StrCat(
              "the in-place expert store maps tensors as the checkpoint stores them; layer ", layer,
              " expert ", e, " tensor ", t.name,
              " is not (16-bit row scales are converted to float32): copy it"));
        }
        // Absolute: a worker started elsewhere resolves it the same way.
        ASSIGN_OR_RETURN(
            const int segment,
            FileSegment(std::filesystem::absolute(found->first).string(), layout, segment_of));
        AddTensorInfo(layer, e, t, segment, found->second, layout);
        mapped += bytes;
      }
    }
  }
  // The same checkpoint, the same generation: workers keep their mappings across a restart.
  uint64_t generation =
      identity.checkpoint_fingerprint ^ (identity.config_checksum * 0x9e3779b97f4a7c15ull);
  if (generation == 0) generation = 1;
  layout.set_generation(generation);
  layout.set_model_dir(model.dir);
  // The page cache places a file's pages: --numa has nothing to bind here.
  const bool numa_unused = options.bind_numa && numa_available() >= 0;
  Say(options, absl::StrFormat("mapping %d expert tensors (%.1f MiB) in place in %d checkpoint "
                               "file(s), generation %016x: nothing copied%s",
                               layout.tensors_size(), mapped / 1048576.0, layout.segments_size(),
                               generation, numa_unused ? "; no NUMA placement in place" : ""));
  return store;
}

}  // namespace strata
