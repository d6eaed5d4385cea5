// libprotobuf's log lines through Strata's log, at most a few a minute: a client that sends
// malformed messages in a loop must not flood the log (each parse error is one line).
#ifndef STRATA_COMMON_UTIL_PROTOBUF_LOG_H_
#define STRATA_COMMON_UTIL_PROTOBUF_LOG_H_

namespace strata {

// Installs the handler for this process; call once from main().
void RateLimitProtobufLog();

}  // namespace strata

#endif  // STRATA_COMMON_UTIL_PROTOBUF_LOG_H_
