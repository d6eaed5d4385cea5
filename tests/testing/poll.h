// Waiting in tests for something another process does: a condition polled until it holds.
#ifndef STRATA_TESTS_TESTING_POLL_H_
#define STRATA_TESTS_TESTING_POLL_H_

#include <chrono>
#include <functional>
#include <thread>

namespace strata::testing {

// Calls `done` until it returns true, `interval` apart, for at most `timeout`. False if it
// never did.
inline bool PollUntil(const std::function<bool()>& done, std::chrono::milliseconds timeout,
                      std::chrono::milliseconds interval = std::chrono::milliseconds(50)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (done()) return true;
    std::this_thread::sleep_for(interval);
  }
  return false;
}

}  // namespace strata::testing

#endif  // STRATA_TESTS_TESTING_POLL_H_
