// strata-expert-store --model DIR [--listen HOST:PORT] [--segment-prefix P] [--reattach=false]
//              [--expert-store copy|in-place]
// Loads every expert into NUMA-local shared memory (or re-attaches to the store a killed
// strata-expert-store left) and serves the layout to the workers.
// Prints "READY <host>:<port>" on stdout once serving.
#include <iostream>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/util/flag_help.h"
#include "common/util/process.h"
#include "common/util/protobuf_log.h"
#include "services/expert-store/expert_store_server.h"

ABSL_FLAG(std::string, model, "", "Hugging Face model directory");
ABSL_FLAG(std::string, listen, "127.0.0.1:0",
          "Address to serve ExpertStore on: unix:PATH, or HOST:PORT (port 0 picks one; needs a "
          "cluster token)");
ABSL_FLAG(std::string, cluster_token_file, "",
          "File holding the cluster token every call must carry (this user's, mode 0600); "
          "empty: $STRATA_CLUSTER_TOKEN, or none");
ABSL_FLAG(std::string, segment_prefix, "strata", "Shared-memory segment name prefix");
ABSL_FLAG(bool, numa, true, "Bind each segment's pages to its NUMA node");
ABSL_FLAG(std::string, expert_store, "copy",
          "copy: the experts into NUMA-local shared memory; in-place: the workers map the "
          "checkpoint's files (no second copy in memory; needs contiguous expert tensors)");
ABSL_FLAG(
    bool, reattach, true,
    "Re-attach to the segments a killed strata-expert-store left under --segment-prefix when their "
    "model, layout and checksums match, instead of copying the model again");
ABSL_FLAG(int, cpu_tier_threads, 0,
          "Threads computing experts for the workers' CPU tier; 0: one per hardware thread");
ABSL_FLAG(std::string, log_level, "warning", "debug, info, warning or error");

int main(int argc, char** argv) {
  strata::BlockTerminationSignals();
  strata::RateLimitProtobufLog();
  strata::SetProgramName("strata-expert-store");
  strata::ParseDaemonFlags(
      argc, argv, "strata-expert-store",
      "strata-expert-store --model DIR [--listen HOST:PORT] [flags]: every expert's weights in "
      "shared memory,\nserved to the workers; prints READY <host>:<port>",
      {__FILE__});
  if (!strata::SetLogLevel(absl::GetFlag(FLAGS_log_level))) {
    std::cerr << "strata-expert-store: --log-level must be debug, info, warning or error\n";
    return 2;
  }
  strata::ExpertStoreServerOptions options;
  options.model_dir = absl::GetFlag(FLAGS_model);
  options.listen = absl::GetFlag(FLAGS_listen);
  auto token = strata::ClusterToken::FromFileOrEnvironment(absl::GetFlag(FLAGS_cluster_token_file));
  if (!token.ok()) {
    std::cerr << "strata-expert-store: " << token.status().message() << "\n";
    return 2;
  }
  options.token = *std::move(token);
  options.store.segment_prefix = absl::GetFlag(FLAGS_segment_prefix);
  options.store.bind_numa = absl::GetFlag(FLAGS_numa);
  const std::string expert_store = absl::GetFlag(FLAGS_expert_store);
  if (expert_store != "copy" && expert_store != "in-place") {
    std::cerr << "strata-expert-store: --expert-store must be copy or in-place\n";
    return 2;
  }
  options.store.in_place = expert_store == "in-place";
  options.reattach = absl::GetFlag(FLAGS_reattach);
  options.store.log = [](const std::string& message) { strata::StatusLine(message); };
  options.cpu_tier.num_threads = absl::GetFlag(FLAGS_cpu_tier_threads);
  options.store.on_progress = [](int layer, int layers, uint64_t bytes) {
    strata::StatusLine(absl::StrFormat("loaded experts of layer %d/%d (%.1f MiB)", layer + 1,
                                       layers, bytes / 1048576.0));
  };
  if (options.model_dir.empty()) {
    std::cerr << "strata-expert-store: --model is required\n";
    return 2;
  }
  auto server = strata::ExpertStoreServer::Start(options);
  if (!server.ok()) {
    std::cerr << "strata-expert-store: " << server.status().message() << "\n";
    return 1;
  }
  std::cout << "READY " << (*server)->address() << std::endl;
  const int signal = strata::WaitForTerminationSignal();
  strata::Log(strata::LogLevel::kInfo, absl::StrCat("signal ", signal, ": removing the store"));
  server->reset();
  return 0;
}
