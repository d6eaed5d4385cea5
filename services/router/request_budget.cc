#include "services/router/request_budget.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace strata {

RequestBudget::Hold::Hold(Hold&& other) noexcept
    : budget_(std::exchange(other.budget_, nullptr)),
      client_(std::move(other.client_)),
      bytes_(std::exchange(other.bytes_, 0)) {}

RequestBudget::Hold& RequestBudget::Hold::operator=(Hold&& other) noexcept {
  if (this != &other) {
    Release();
    budget_ = std::exchange(other.budget_, nullptr);
    client_ = std::move(other.client_);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

void RequestBudget::Hold::Release() {
  if (budget_ != nullptr) budget_->Give(client_, bytes_);
  budget_ = nullptr;
  bytes_ = 0;
}

absl::Status RequestBudget::Fits(int64_t mine, int64_t bytes) const {
  if (mine > 0 && mine + bytes > options_.per_client_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("this client has ", mine, " bytes of requests being prepared; ", bytes,
                     " more would pass its limit of ", options_.per_client_bytes,
                     " (retry when they are done)"));
  }
  if (total_ > 0 && total_ + bytes > options_.total_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the server is preparing ", total_, " bytes of requests; ", bytes,
                     " more would pass its limit of ", options_.total_bytes, " (retry later)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<RequestBudget::Hold> RequestBudget::Take(const std::string& client, int64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  const auto it = by_client_.find(client);
  const int64_t mine = it == by_client_.end() ? 0 : it->second;
  if (absl::Status fits = Fits(mine, bytes); !fits.ok()) return fits;
  by_client_[client] += bytes;
  total_ += bytes;
  return Hold(this, client, bytes);
}

absl::Status RequestBudget::Hold::Grow(int64_t bytes) {
  if (budget_ == nullptr) return absl::FailedPreconditionError("an empty hold");
  RequestBudget& b = *budget_;
  std::lock_guard<std::mutex> lock(b.mu_);
  if (absl::Status fits = b.Fits(b.by_client_[client_], bytes); !fits.ok()) return fits;
  b.by_client_[client_] += bytes;
  b.total_ += bytes;
  bytes_ += bytes;
  return absl::OkStatus();
}

void RequestBudget::Give(const std::string& client, int64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  total_ -= bytes;
  auto it = by_client_.find(client);
  if (it == by_client_.end()) return;
  it->second -= bytes;
  if (it->second <= 0) by_client_.erase(it);
}

int64_t RequestBudget::in_flight() const {
  std::lock_guard<std::mutex> lock(mu_);
  return total_;
}

}  // namespace strata
