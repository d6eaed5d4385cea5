#include "services/kvcache/expert_store.h"

#include <numa.h>

#include <cstring>
#include <random>

#include "absl/strings/str_cat.h"
#include "boost/interprocess/mapped_region.hpp"
#include "boost/interprocess/shared_memory_object.hpp"

namespace strata {
namespace bip = boost::interprocess;

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
  matrix("gate", f.gate);
  matrix("up", f.up);
  matrix("down", f.down);
  vector("gate_bias", f.gate_bias);
  vector("up_bias", f.up_bias);
  vector("down_bias", f.down_bias);
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

}  // namespace

struct ExpertStore::Segment {
  std::string name;
  bip::shared_memory_object object;
  bip::mapped_region region;
  ~Segment() { bip::shared_memory_object::remove(name.c_str()); }
};

ExpertStore::~ExpertStore() = default;

absl::StatusOr<std::unique_ptr<ExpertStore>> ExpertStore::Build(const Model& model,
                                                                const ExpertStoreOptions& options) {
  const ModelConfig& c = model.config;
  int num_nodes = 1;
  const bool numa = options.bind_numa && numa_available() >= 0;
  if (numa) num_nodes = std::max(1, numa_num_configured_nodes());

  // Plan: expert e of every layer lives on node e % num_nodes.
  std::unique_ptr<ExpertStore> store(new ExpertStore());
  std::vector<uint64_t> segment_bytes(num_nodes, 0);
  for (int layer = 0; layer < c.num_layers; ++layer) {
    const auto& experts = model.weights.layers[layer].experts;
    for (int e = 0; e < static_cast<int>(experts.size()); ++e) {
      const int node = e % num_nodes;
      for (const TensorSource& t : ExpertTensors(experts[e])) {
        v1::ExpertTensorInfo* info = store->layout_.add_tensors();
        info->set_layer(layer);
        info->set_expert(e);
        info->set_tensor(t.name);
        info->set_segment(node);
        info->set_offset(segment_bytes[node]);
        info->set_dtype(std::string(DTypeName(t.dtype)));
        info->add_shape(t.out);
        if (t.in > 0) info->add_shape(t.in);
        segment_bytes[node] = AlignUp(segment_bytes[node] + TensorBytes(t), kTensorAlignment);
      }
    }
  }

  std::random_device rd;
  store->layout_.set_generation((static_cast<uint64_t>(rd()) << 32) | rd());
  store->layout_.set_model_dir(model.dir);
  try {
    for (int node = 0; node < num_nodes; ++node) {
      auto segment = std::make_unique<Segment>();
      segment->name = absl::StrCat(options.segment_prefix, "-experts-", node);
      bip::shared_memory_object::remove(segment->name.c_str());  // a stale one from a crash
      segment->object =
          bip::shared_memory_object(bip::create_only, segment->name.c_str(), bip::read_write);
      const uint64_t bytes = std::max<uint64_t>(segment_bytes[node], 4096);
      segment->object.truncate(static_cast<bip::offset_t>(bytes));
      segment->region = bip::mapped_region(segment->object, bip::read_write);
      // Bind before the first write so the pages are allocated on the node.
      if (numa) numa_tonode_memory(segment->region.get_address(), bytes, node);
      v1::SharedSegmentInfo* info = store->layout_.add_segments();
      info->set_name(segment->name);
      info->set_bytes(bytes);
      info->set_numa_node(numa ? node : -1);
      store->segments_.push_back(std::move(segment));
    }
  } catch (const bip::interprocess_exception& e) {
    return absl::InternalError(absl::StrCat("expert store: shared memory: ", e.what()));
  }

  // Copy, tensor by tensor, in layout order.
  int index = 0;
  uint64_t copied = 0;
  for (int layer = 0; layer < c.num_layers; ++layer) {
    const auto& experts = model.weights.layers[layer].experts;
    for (const FfnWeights& expert : experts) {
      for (const TensorSource& t : ExpertTensors(expert)) {
        const v1::ExpertTensorInfo& info = store->layout_.tensors(index++);
        auto* base = static_cast<uint8_t*>(store->segments_[info.segment()]->region.get_address());
        CopyContiguous(t, base + info.offset());
        copied += TensorBytes(t);
      }
    }
    if (options.on_progress) options.on_progress(layer, c.num_layers, copied);
  }
  return store;
}

}  // namespace strata
