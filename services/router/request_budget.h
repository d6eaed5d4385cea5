// Bytes of client requests the router is working on before the scheduler takes them (parsing,
// tokenizing, templating): bounded in total and per client connection, so that a few huge
// requests cannot take every handler thread and the memory before any later limit applies.
// A request over either bound is refused at once with RESOURCE_EXHAUSTED; small ones fit.
#ifndef STRATA_SERVICES_ROUTER_REQUEST_BUDGET_H_
#define STRATA_SERVICES_ROUTER_REQUEST_BUDGET_H_

#include <cstdint>
#include <mutex>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"

namespace strata {

struct RequestBudgetOptions {
  int64_t total_bytes = int64_t{64} << 20;
  int64_t per_client_bytes = int64_t{16} << 20;
};

class RequestBudget {
 public:
  // What one request holds of the budget; gives it back when destroyed.
  class Hold {
   public:
    Hold() = default;
    Hold(Hold&& other) noexcept;
    Hold& operator=(Hold&& other) noexcept;
    Hold(const Hold&) = delete;
    Hold& operator=(const Hold&) = delete;
    ~Hold() { Release(); }
    void Release();
    // Takes `bytes` more under the same bounds (RESOURCE_EXHAUSTED, and nothing taken, when
    // they would pass one).
    absl::Status Grow(int64_t bytes);

   private:
    friend class RequestBudget;
    Hold(RequestBudget* budget, std::string client, int64_t bytes)
        : budget_(budget), client_(std::move(client)), bytes_(bytes) {}
    RequestBudget* budget_ = nullptr;
    std::string client_;
    int64_t bytes_ = 0;
  };

  explicit RequestBudget(RequestBudgetOptions options = {}) : options_(options) {}

  // Takes `bytes` for `client` (a connection: gRPC's peer, an HTTP peer address) or
  // RESOURCE_EXHAUSTED saying which bound it would pass. Thread-safe.
  absl::StatusOr<Hold> Take(const std::string& client, int64_t bytes);

  int64_t in_flight() const;

 private:
  void Give(const std::string& client, int64_t bytes);
  // Under mu_: OK when `bytes` more for `client`, which holds `mine`, stay within the bounds.
  absl::Status Fits(int64_t mine, int64_t bytes) const;

  const RequestBudgetOptions options_;
  mutable std::mutex mu_;
  int64_t total_ = 0;
  absl::flat_hash_map<std::string, int64_t> by_client_;
};

}  // namespace strata

#endif  // STRATA_SERVICES_ROUTER_REQUEST_BUDGET_H_
