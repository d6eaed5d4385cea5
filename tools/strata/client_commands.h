// `strata generate --server HOST:PORT`: a client of the cluster's Generation API.
#ifndef STRATA_TOOLS_STRATA_CLIENT_COMMANDS_H_
#define STRATA_TOOLS_STRATA_CLIENT_COMMANDS_H_

#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "strata/v1/generation.pb.h"
#include "tools/strata/admin_target.h"

namespace strata {

struct RemoteGenerateOptions {
  std::string server;
  v1::GenerateRequest request;
  bool stream_text = false;  // print text to `out` as it arrives instead of JSON at the end
  absl::Duration timeout = absl::Minutes(10);
};

// Prints {"token_ids": [...], "text": "...", "finish_reason": "...", "usage": {...}}; with
// stream_text, the text as it arrives and then "[finish: REASON]" (stop, length, eos, ...) on
// `err`.
absl::Status RunRemoteGenerate(const RemoteGenerateOptions& options, std::ostream& out,
                               std::ostream& err);

// `strata stats`: the router's counters (strata.v1.Admin.Stats) as JSON, every number a JSON
// number.
absl::Status RunStats(const AdminTarget& admin, std::ostream& out);
// Admin.SetHotRatio: `value` is a number in [0, 1] or "auto"; prints what is in effect.
absl::Status RunSetHotRatio(const AdminTarget& admin, const std::string& value, std::ostream& out);
// `strata kv-resize`: Admin.ResizeKvCache; prints the pool's blocks, those moved and the time.
absl::Status RunResizeKvCache(const AdminTarget& admin, int blocks, std::ostream& out);

}  // namespace strata

#endif  // STRATA_TOOLS_STRATA_CLIENT_COMMANDS_H_
