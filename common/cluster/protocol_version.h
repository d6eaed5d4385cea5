// The one version of everything Strata's processes exchange: the Coordinator and ExpertWorker
// messages (proto/strata/v1/cluster.proto), the per-layer messages (common/transport/
// expert_wire.h, common/transport/cuda_ipc/link_views.h), the headers of the shared-memory
// channels and rings (common/shm/) and the expert store's meta segment
// (services/expert-store/store_meta.h). A cluster's processes must come from builds that speak
// the same one: the router refuses a worker of another at registration, and a channel, ring or
// store segment written by another is refused when opened. Raise it with any change to one of
// them that an older build would misread.
#ifndef STRATA_COMMON_CLUSTER_PROTOCOL_VERSION_H_
#define STRATA_COMMON_CLUSTER_PROTOCOL_VERSION_H_

#include <cstdint>

namespace strata {

// 1: each format versioned apart; 2: one version, sent at registration.
inline constexpr uint32_t kClusterProtocolVersion = 2;

}  // namespace strata

#endif  // STRATA_COMMON_CLUSTER_PROTOCOL_VERSION_H_
