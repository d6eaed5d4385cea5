#include "common/transport/tier_counters_proto.h"

namespace strata {

void TierCountersToProto(const TierCounters& c, v1::TierCounters& t) {
  t.set_hot_hits(c.hot_hits);
  t.set_warm_hits(c.warm_hits);
  t.set_misses(c.misses);
  t.set_bytes_copied(c.bytes_copied);
  t.set_evictions(c.evictions);
  t.set_prefetch_loads(c.prefetch_loads);
  t.set_prefetch_hits(c.prefetch_hits);
  t.set_cpu_tier_experts(c.cpu_tier_experts);
  t.set_hot_slots(c.hot_slots);
  t.set_warm_slots(c.warm_slots);
  t.set_slot_bytes(c.slot_bytes);
  t.set_lent_slots(c.lent_slots);
}

TierCounters TierCountersFromProto(const v1::TierCounters& t) {
  return TierCounters{t.hot_hits(),  t.warm_hits(),      t.misses(),        t.bytes_copied(),
                      t.evictions(), t.prefetch_loads(), t.prefetch_hits(), t.cpu_tier_experts(),
                      t.hot_slots(), t.warm_slots(),     t.slot_bytes(),    t.lent_slots()};
}

}  // namespace strata
