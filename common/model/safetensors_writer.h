// Writes safetensors files fast and without holding them in memory: the header first, then the
// tensor bytes that a caller's fill function produces chunk by chunk on several threads.
#ifndef STRATA_COMMON_MODEL_SAFETENSORS_WRITER_H_
#define STRATA_COMMON_MODEL_SAFETENSORS_WRITER_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "common/tensor/dtype.h"

namespace strata {

struct SafetensorsTensorHeader {
  std::string name;
  DType dtype = DType::kBF16;
  std::vector<int64_t> shape;
  uint64_t bytes() const;
};

// Writes bytes [begin, begin + n) of the data of tensor `index` into `out`. Called from several
// threads at once, for disjoint ranges; `begin` and `n` are multiples of the element size (an
// element a chunk cuts is asked for whole, into scratch).
using SafetensorsFill = std::function<void(size_t index, uint64_t begin, uint64_t n, uint8_t* out)>;

// One safetensors file at `path` holding `tensors` in order, their data from `fill` run on
// `threads` threads. The header is padded so the data starts page-aligned.
absl::Status WriteSafetensorsFile(const std::string& path,
                                  absl::Span<const SafetensorsTensorHeader> tensors,
                                  const SafetensorsFill& fill, int threads);

// Writes `text` to `path`, replacing it.
absl::Status WriteTextFile(const std::string& path, const std::string& text);

}  // namespace strata

#endif  // STRATA_COMMON_MODEL_SAFETENSORS_WRITER_H_
