#include "common/transport/mapped_experts.h"

#include <optional>

#include "absl/strings/str_cat.h"
#include "boost/interprocess/file_mapping.hpp"
#include "boost/interprocess/mapped_region.hpp"
#include "common/shm/shared_segment.h"
#include "common/util/file_stamp.h"
#include "common/util/status_macros.h"

namespace strata {
namespace bip = boost::interprocess;

struct MappedExperts::Mapping {
  std::optional<SharedSegment> segment;  // a store's shared memory, read-only
  bip::file_mapping file;                // or a checkpoint file mapped in place
  bip::mapped_region region;
  bool in_place = false;

  const uint8_t* data() const {
    return segment ? segment->data() : static_cast<const uint8_t*>(region.get_address());
  }
  size_t size() const { return segment ? segment->size() : region.get_size(); }
};

absl::Status MappedExperts::CheckFileUnchanged(const v1::SharedSegmentInfo& segment) {
  const absl::StatusOr<FileStamp> now = StampFile(segment.file_path());
  if (!now.ok() || *now != FileStamp{segment.bytes(), segment.file_mtime_ns()}) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint file ", segment.file_path(),
        " changed (or went) since strata-expert-store mapped it; restart strata-expert-store"));
  }
  return absl::OkStatus();
}

MappedExperts::~MappedExperts() = default;

absl::StatusOr<std::unique_ptr<MappedExperts>> MappedExperts::Map(const v1::ExpertLayout& layout,
                                                                  const ModelConfig& config) {
  std::unique_ptr<MappedExperts> mapped(new MappedExperts());
  mapped->generation_ = layout.generation();
  try {
    for (const auto& segment : layout.segments()) {
      auto m = std::make_unique<Mapping>();
      if (segment.file_path().empty()) {
        // This user's own segment only (SharedSegment::Open checks the owner and the mode).
        absl::StatusOr<SharedSegment> shared =
            SharedSegment::Open(segment.name(), /*read_only=*/true);
        if (!shared.ok()) {
          return absl::Status(shared.status().code(), absl::StrCat("cannot map the expert store: ",
                                                                   shared.status().message()));
        }
        m->segment = *std::move(shared);
      } else {
        RETURN_IF_ERROR(CheckFileUnchanged(segment));
        m->file = bip::file_mapping(segment.file_path().c_str(), bip::read_only);
        m->region = bip::mapped_region(m->file, bip::read_only);
        m->in_place = true;
      }
      if (m->size() < segment.bytes()) {
        return absl::FailedPreconditionError(
            absl::StrCat("expert segment ", segment.name(), " is smaller than its layout says"));
      }
      mapped->mappings_.push_back(std::move(m));
    }
  } catch (const bip::interprocess_exception& e) {
    return absl::UnavailableError(absl::StrCat("cannot map the expert store: ", e.what()));
  }

  mapped->experts_.resize(config.num_layers);
  for (int layer = 0; layer < config.num_layers; ++layer) {
    if (config.layer_is_moe[layer]) mapped->experts_[layer].resize(config.num_experts);
  }
  const int64_t h = config.hidden_size, inter = config.moe_intermediate_size;
  // What each layout tensor name binds: a matrix, a vector, or a matrix's row or block scales.
  enum Kind { kMatrix, kVector, kRowScales, kBlockScales };
  struct Binding {
    const char* name;
    Kind kind;
    WeightMatrix FfnWeights::*matrix;
    WeightVector FfnWeights::*vector;
    int64_t rows, cols;
  };
  const Binding bindings[] = {
      {"gate", kMatrix, &FfnWeights::gate, nullptr, inter, h},
      {"up", kMatrix, &FfnWeights::up, nullptr, inter, h},
      {"down", kMatrix, &FfnWeights::down, nullptr, h, inter},
      {"gate_bias", kVector, nullptr, &FfnWeights::gate_bias, inter, 0},
      {"up_bias", kVector, nullptr, &FfnWeights::up_bias, inter, 0},
      {"down_bias", kVector, nullptr, &FfnWeights::down_bias, h, 0},
      {"gate_scale", kRowScales, &FfnWeights::gate, nullptr, inter, 0},
      {"up_scale", kRowScales, &FfnWeights::up, nullptr, inter, 0},
      {"down_scale", kRowScales, &FfnWeights::down, nullptr, h, 0},
      {"gate_block_scales", kBlockScales, &FfnWeights::gate, nullptr, inter, h},
      {"up_block_scales", kBlockScales, &FfnWeights::up, nullptr, inter, h},
      {"down_block_scales", kBlockScales, &FfnWeights::down, nullptr, h, inter},
  };
  for (const auto& t : layout.tensors()) {
    const std::string where = absl::StrCat("expert store: layer ", t.layer(), " expert ",
                                           t.expert(), " tensor ", t.tensor(), ": ");
    if (t.layer() >= mapped->experts_.size() || t.expert() >= mapped->experts_[t.layer()].size()) {
      return absl::FailedPreconditionError(where + "not in this model");
    }
    if (t.segment() >= mapped->mappings_.size()) {
      return absl::FailedPreconditionError(where + "segment out of range");
    }
    auto dtype = ParseDType(t.dtype());
    if (!dtype.ok())
      return absl::FailedPreconditionError(where + std::string(dtype.status().message()));
    const Mapping& region = *mapped->mappings_[t.segment()];
    int64_t elements = 1;
    for (int64_t d : t.shape()) elements *= d;
    if (t.offset() + elements * DTypeSize(*dtype) > region.size()) {
      return absl::FailedPreconditionError(where + "runs past its segment");
    }
    const void* data = region.data() + t.offset();
    FfnWeights& f = mapped->experts_[t.layer()][t.expert()];
    auto matrix = [&](WeightMatrix& m, int64_t out, int64_t in) -> absl::Status {
      if (t.shape_size() != 2 || t.shape(0) != out || t.shape(1) != in) {
        return absl::FailedPreconditionError(where + "shape does not match the model");
      }
      const float* scale = m.scale;  // scales may come first
      const Fp8BlockScales blocks = m.blocks;
      m = WeightMatrix{data, *dtype, out, in, in, 1};
      m.scale = scale;
      m.blocks = blocks;
      m.blocks.origin = static_cast<const uint8_t*>(data);
      return absl::OkStatus();
    };
    auto row_scale = [&](WeightMatrix& m, int64_t out) -> absl::Status {
      if (t.shape_size() != 1 || t.shape(0) != out || *dtype != DType::kF32) {
        return absl::FailedPreconditionError(where + "row scales must be F32 [out]");
      }
      m.scale = static_cast<const float*>(data);
      return absl::OkStatus();
    };
    // The model's blocks over the whole [out, in] expert matrix, wherever it is mapped.
    auto block_scales = [&](WeightMatrix& m, int64_t out, int64_t in) -> absl::Status {
      Fp8BlockScales b = m.blocks;
      b.rows = out;
      b.cols = in;
      b.block_rows = config.fp8_block_rows;
      b.block_cols = config.fp8_block_cols;
      if (!config.fp8_block_scaled() || t.shape_size() != 2 || t.shape(0) != b.grid_rows() ||
          t.shape(1) != b.grid_cols() || *dtype != DType::kF32) {
        return absl::FailedPreconditionError(
            where +
            "block scales must be F32 [ceil(out / block rows), ceil(in / block cols)] "
            "of the model's quantization_config.weight_block_size");
      }
      b.data = static_cast<const float*>(data);
      b.origin = static_cast<const uint8_t*>(m.data);  // null until the matrix is bound
      m.blocks = b;
      return absl::OkStatus();
    };
    auto vector = [&](WeightVector& v, int64_t size) -> absl::Status {
      if (t.shape_size() != 1 || t.shape(0) != size) {
        return absl::FailedPreconditionError(where + "shape does not match the model");
      }
      v = WeightVector{data, *dtype, size, 1};
      return absl::OkStatus();
    };
    absl::Status status = absl::FailedPreconditionError(where + "unknown tensor name");
    for (const Binding& b : bindings) {
      if (t.tensor() != b.name) continue;
      switch (b.kind) {
        case kMatrix:
          status = matrix(f.*b.matrix, b.rows, b.cols);
          break;
        case kVector:
          status = vector(f.*b.vector, b.rows);
          break;
        case kRowScales:
          status = row_scale(f.*b.matrix, b.rows);
          break;
        case kBlockScales:
          status = block_scales(f.*b.matrix, b.rows, b.cols);
          break;
      }
      break;
    }
    if (!status.ok()) return status;
  }
  for (int layer = 0; layer < config.num_layers; ++layer) {
    for (size_t e = 0; e < mapped->experts_[layer].size(); ++e) {
      const FfnWeights& f = mapped->experts_[layer][e];
      if (!f.gate.present() || !f.up.present() || !f.down.present()) {
        return absl::FailedPreconditionError(
            absl::StrCat("expert store: layer ", layer, " expert ", e, " is incomplete"));
      }
      for (const WeightMatrix* m : {&f.gate, &f.up, &f.down}) {
        if (!m->scales_match_dtype()) {
          return absl::FailedPreconditionError(
              absl::StrCat("expert store: layer ", layer, " expert ", e, ": a ",
                           DTypeName(m->dtype), " matrix ", m->scaled() ? "with" : "without",
                           " scales (FP8 E4M3 matrices, and only they, have them, of one layout)"));
        }
      }
    }
  }
  return mapped;
}

std::vector<absl::Span<const uint8_t>> MappedExperts::segments() const {
  std::vector<absl::Span<const uint8_t>> out;
  for (const auto& m : mappings_) {
    if (m->in_place) continue;
    out.emplace_back(m->data(), m->size());
  }
  return out;
}

std::vector<absl::Span<const uint8_t>> MappedExperts::files() const {
  std::vector<absl::Span<const uint8_t>> out;
  for (const auto& m : mappings_) {
    if (!m->in_place) continue;
    out.emplace_back(m->data(), m->size());
  }
  return out;
}

const FfnWeights* MappedExperts::Find(int layer, int expert) const {
  if (layer < 0 || layer >= static_cast<int>(experts_.size())) return nullptr;
  if (expert < 0 || expert >= static_cast<int>(experts_[layer].size())) return nullptr;
  return &experts_[layer][expert];
}

}  // namespace strata
