// TierCounters <-> strata.v1.TierCounters.
#ifndef STRATA_COMMON_TRANSPORT_TIER_COUNTERS_PROTO_H_
#define STRATA_COMMON_TRANSPORT_TIER_COUNTERS_PROTO_H_

#include "common/transport/expert_wire.h"
#include "strata/v1/cluster.pb.h"

namespace strata {

void TierCountersToProto(const TierCounters& counters, v1::TierCounters& proto);
TierCounters TierCountersFromProto(const v1::TierCounters& proto);

}  // namespace strata

#endif  // STRATA_COMMON_TRANSPORT_TIER_COUNTERS_PROTO_H_
