// strata-cache --model DIR [--listen HOST:PORT]
// Loads every expert into NUMA-local shared memory and serves the layout to the workers.
// Prints "READY <host>:<port>" on stdout once serving.
#include <iostream>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/util/process.h"
#include "services/kvcache/cache_server.h"

ABSL_FLAG(std::string, model, "", "Hugging Face model directory");
ABSL_FLAG(std::string, listen, "127.0.0.1:0", "Address to serve ExpertStore on; port 0 picks one");
ABSL_FLAG(std::string, segment_prefix, "strata", "Shared-memory segment name prefix");
ABSL_FLAG(bool, numa, true, "Bind each segment's pages to its NUMA node");
ABSL_FLAG(std::string, log_level, "warning", "debug, info, warning or error");

int main(int argc, char** argv) {
  strata::BlockTerminationSignals();
  strata::SetProgramName("strata-cache");
  strata::DashedFlags flags(argc, argv);
  absl::ParseCommandLine(flags.argc(), flags.argv());
  if (!strata::SetLogLevel(absl::GetFlag(FLAGS_log_level))) {
    std::cerr << "strata-cache: --log-level must be debug, info, warning or error\n";
    return 2;
  }
  strata::CacheOptions options;
  options.model_dir = absl::GetFlag(FLAGS_model);
  options.listen = absl::GetFlag(FLAGS_listen);
  options.store.segment_prefix = absl::GetFlag(FLAGS_segment_prefix);
  options.store.bind_numa = absl::GetFlag(FLAGS_numa);
  options.store.on_progress = [](int layer, int layers, uint64_t bytes) {
    strata::StatusLine(absl::StrFormat("loaded experts of layer %d/%d (%.1f MiB)", layer + 1,
                                       layers, bytes / 1048576.0));
  };
  if (options.model_dir.empty()) {
    std::cerr << "strata-cache: --model is required\n";
    return 2;
  }
  auto server = strata::CacheServer::Start(options);
  if (!server.ok()) {
    std::cerr << "strata-cache: " << server.status().message() << "\n";
    return 1;
  }
  std::cout << "READY " << (*server)->address() << std::endl;
  const int signal = strata::WaitForTerminationSignal();
  strata::Log(strata::LogLevel::kInfo, absl::StrCat("signal ", signal, ": removing the store"));
  server->reset();
  return 0;
}
