// A fixed pool of worker threads for data-parallel loops.
#ifndef STRATA_COMMON_UTIL_THREAD_POOL_H_
#define STRATA_COMMON_UTIL_THREAD_POOL_H_

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace strata {

class ThreadPool {
 public:
  // `num_threads` <= 0 means one per hardware thread. The calling thread also works.
  explicit ThreadPool(int num_threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return static_cast<int>(workers_.size()) + 1; }

  // Calls fn(begin, end) over disjoint ranges covering [0, n), each at least `grain` long
  // (except the last), and returns when all are done. Not reentrant: `fn` must not call
  // ParallelFor on the same pool.
  void ParallelFor(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

 private:
  void WorkerLoop();
  void RunChunks();

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  bool stop_ = false;
  uint64_t generation_ = 0;
  int active_ = 0;
  // The loop in progress.
  const std::function<void(int64_t, int64_t)>* fn_ = nullptr;
  int64_t n_ = 0;
  int64_t chunk_ = 0;
  int64_t next_ = 0;
};

}  // namespace strata

#endif  // STRATA_COMMON_UTIL_THREAD_POOL_H_
