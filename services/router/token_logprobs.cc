#include "services/router/token_logprobs.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>
#include <vector>

namespace strata {

TokenLogprobs LogprobsAt(const float* row, int64_t vocab, int32_t target, int top) {
  const size_t keep = static_cast<size_t>(std::clamp<int64_t>(top, 0, vocab));
  using Entry = std::pair<float, int32_t>;  // (logit, token id)
  // `a` ranks above `b`: the order the top tokens are reported in.
  const auto better = [](const Entry& a, const Entry& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  // With `better` as the heap's order, its front is the worst token kept: a token enters only
  // by beating it, which most of a peaked distribution's vocabulary does not.
  std::vector<Entry> heap;
  heap.reserve(keep);
  float max = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < vocab; ++i) {
    const float x = row[i];
    max = std::max(max, x);
    if (keep == 0) continue;
    const Entry e{x, static_cast<int32_t>(i)};
    if (heap.size() < keep) {
      heap.push_back(e);
      std::push_heap(heap.begin(), heap.end(), better);
    } else if (better(e, heap.front())) {
      std::pop_heap(heap.begin(), heap.end(), better);
      heap.back() = e;
      std::push_heap(heap.begin(), heap.end(), better);
    }
  }
  double sum = 0.0;
  for (int64_t i = 0; i < vocab; ++i) sum += std::exp(static_cast<double>(row[i] - max));
  const float log_sum = static_cast<float>(std::log(sum));
  TokenLogprobs out;
  out.logprob = row[target] - max - log_sum;
  std::sort_heap(heap.begin(), heap.end(), better);  // best first
  out.top.reserve(heap.size());
  for (const Entry& e : heap) out.top.emplace_back(e.second, e.first - max - log_sum);
  return out;
}

}  // namespace strata
