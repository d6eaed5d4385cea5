// What a counter of another process (a worker's tier counters, the router's Stats) counted
// between two readings. A process that started again in between counts from zero: the span
// then counts from its start.
#ifndef STRATA_COMMON_UTIL_COUNTER_SINCE_H_
#define STRATA_COMMON_UTIL_COUNTER_SINCE_H_

#include <cstdint>

namespace strata {

inline uint64_t CounterSince(uint64_t before, uint64_t after) {
  return after >= before ? after - before : after;
}

}  // namespace strata

#endif  // STRATA_COMMON_UTIL_COUNTER_SINCE_H_
