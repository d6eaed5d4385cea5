#include "common/cuda/clock_stamps.h"

#include <cinttypes>

#include "absl/strings/str_cat.h"
#include "common/cuda/cuda_status.h"
#include "common/util/status_macros.h"

namespace strata::gpu {

absl::StatusOr<std::unique_ptr<ClockStamps>> ClockStamps::Open(const std::string& path,
                                                               const std::string& who, int slots) {
  if (slots <= 0) return absl::InvalidArgumentError("clock stamps: no slots");
  std::unique_ptr<ClockStamps> s(new ClockStamps());
  s->file_ = std::fopen(path.c_str(), "a");
  if (s->file_ == nullptr) {
    return absl::NotFoundError(absl::StrCat("clock stamps: cannot open ", path));
  }
  ASSIGN_OR_RETURN(s->slots_, DeviceBuffer<uint64_t>::Allocate(static_cast<size_t>(slots)));
  CUDA_RETURN_IF_ERROR(cudaMemset(s->slots_.data(), 0, slots * sizeof(uint64_t)));
  s->host_.resize(slots);
  std::fprintf(s->file_, "# %s %d\n", who.c_str(), slots);
  return s;
}

ClockStamps::~ClockStamps() {
  if (file_ != nullptr) std::fclose(file_);
}

absl::Status ClockStamps::Mark(cudaStream_t stream, int slot) {
  if (slot < 0 || slot >= static_cast<int>(host_.size())) {
    return absl::OutOfRangeError(absl::StrCat("clock stamp slot ", slot));
  }
  CUDA_RETURN_IF_ERROR(LaunchClockStamp(slots_.data() + slot, stream));
  return absl::OkStatus();
}

absl::Status ClockStamps::Flush(cudaStream_t stream) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  CUDA_RETURN_IF_ERROR(cudaStreamIsCapturing(stream, &capture));
  if (capture != cudaStreamCaptureStatusNone) return absl::OkStatus();  // a step being captured
  const size_t bytes = host_.size() * sizeof(uint64_t);
  CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(host_.data(), slots_.data(), bytes, cudaMemcpyDeviceToHost, stream));
  CUDA_RETURN_IF_ERROR(cudaMemsetAsync(slots_.data(), 0, bytes, stream));
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  bool any = false;
  for (size_t i = 0; i < host_.size(); ++i) {
    if (host_[i] == 0) continue;
    if (!any) std::fprintf(file_, "%" PRIu64, step_);
    any = true;
    std::fprintf(file_, " %zu:%" PRIu64, i, host_[i]);
  }
  if (any) {
    std::fputc('\n', file_);
    std::fflush(file_);  // a killed process keeps what it stamped
  }
  ++step_;
  return absl::OkStatus();
}

}  // namespace strata::gpu
