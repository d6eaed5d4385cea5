#include "tools/strata/cluster_config.h"

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <functional>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace strata {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::string Write(const std::string& name, const std::string& text) {
  // This process's own name: other test binaries run beside it and write the same names.
  const std::string path = ::testing::TempDir() + "/" + std::to_string(::getpid()) + "-" + name;
  std::ofstream(path) << text;
  return path;
}

TEST(ClusterConfigTest, YamlWithNestedKeys) {
  ClusterConfig c;
  ASSERT_TRUE(LoadClusterConfig(Write("a.yaml",
                                      "model: /m\nworkers: 3\ngate_temperature: 0.7\n"
                                      "kv_cache:\n  block_size: 16\n  memory_mb: 512\n"
                                      "max_queued_requests: 9\ntransport: grpc\n"),
                                c)
                  .ok());
  EXPECT_EQ(c.model, "/m");
  EXPECT_EQ(c.workers, 3);
  EXPECT_FLOAT_EQ(c.gate_temperature, 0.7f);
  EXPECT_EQ(c.kv.block_size, 16);
  EXPECT_EQ(c.kv.memory_mb, 512);
  EXPECT_EQ(c.max_queued_requests, 9);
  EXPECT_EQ(c.transport, "grpc");
  EXPECT_EQ(c.max_running, 64);  // untouched keys keep their defaults
}

// router_temperature, the gate temperature's older name, is still taken as a key and a flag,
// and reaches the router under the new one.
TEST(ClusterConfigTest, OlderNameOfTheGateTemperature) {
  ClusterConfig c;
  ASSERT_TRUE(LoadClusterConfig(Write("older.yaml", "router_temperature: 0.7\n"), c).ok());
  EXPECT_FLOAT_EQ(c.gate_temperature, 0.7f);
  ASSERT_TRUE(ApplyClusterFlags({"--router-temperature", "0.5"}, c).ok());
  EXPECT_FLOAT_EQ(c.gate_temperature, 0.5f);
  ASSERT_TRUE(ApplyClusterFlags({"--gate-temperature=0.25"}, c).ok());
  EXPECT_FLOAT_EQ(c.gate_temperature, 0.25f);
  const auto router = DaemonArgs(c, Daemon::kRouter);
  EXPECT_NE(std::find(router.begin(), router.end(), "--gate-temperature=0.25"), router.end());
  for (const std::string& arg : router) EXPECT_THAT(arg, Not(HasSubstr("router-temperature")));
}

TEST(ClusterConfigTest, Json) {
  ClusterConfig c;
  ASSERT_TRUE(
      LoadClusterConfig(Write("a.json", R"({"workers": 2, "kv_cache": {"block_size": 64}})"), c)
          .ok());
  EXPECT_EQ(c.workers, 2);
  EXPECT_EQ(c.kv.block_size, 64);
}

TEST(ClusterConfigTest, TierKeys) {
  ClusterConfig c;
  EXPECT_EQ(c.hot_ratio, "auto");
  EXPECT_TRUE(c.prefetch);
  EXPECT_TRUE(c.overlap_steps);
  ASSERT_TRUE(LoadClusterConfig(Write("tiers.yaml",
                                      "gpu_memory_budget: 24GiB\nhot_ratio: 0.3\n"
                                      "hot_ratio_policy: \"1024:0.5,0.25\"\n"
                                      "cache_policy: lru\ncold_experts: cpu\nprefetch: false\n"
                                      "overlap_steps: false\n"),
                                c)
                  .ok());
  EXPECT_EQ(c.gpu_memory_budget, "24GiB");
  EXPECT_EQ(c.hot_ratio, "0.3");
  EXPECT_EQ(c.hot_ratio_policy, "1024:0.5,0.25");
  EXPECT_EQ(c.cache_policy, "lru");
  EXPECT_EQ(c.cold_experts, "cpu");
  EXPECT_FALSE(c.prefetch);
  EXPECT_FALSE(c.overlap_steps);
  ASSERT_TRUE(LoadClusterConfig(Write("auto.yaml", "hot_ratio: auto\n"), c).ok());
  EXPECT_EQ(c.hot_ratio, "auto");
  auto message = [&](const std::string& text) {
    return std::string(LoadClusterConfig(Write("bad.yaml", text), c).message());
  };
  EXPECT_THAT(message("hot_ratio: 1.5\n"), HasSubstr("bad value for \"hot_ratio\""));
  EXPECT_THAT(message("hot_ratio: lots\n"), HasSubstr("bad value for \"hot_ratio\""));
  // The policy is checked at load, not when the router starts.
  EXPECT_THAT(message("hot_ratio_policy: \"2048:0.3,512:0.5,0.2\"\n"),
              HasSubstr("bad value for \"hot_ratio_policy\""));
  EXPECT_THAT(message("hot_ratio_policy: \"512:1.5,0.2\"\n"),
              HasSubstr("bad value for \"hot_ratio_policy\""));
  EXPECT_THAT(message("gpu_memory_budget: 24 parsecs\n"),
              HasSubstr("bad value for \"gpu_memory_budget\""));
  EXPECT_THAT(message("cache_policy: mru\n"), HasSubstr("bad value for \"cache_policy\""));
  EXPECT_THAT(message("cold_experts: disk\n"), HasSubstr("bad value for \"cold_experts\""));
  EXPECT_THAT(message("mps: maybe\n"), HasSubstr("bad value for \"mps\""));
  ASSERT_TRUE(LoadClusterConfig(Write("mps.yaml", "mps: off\n"), c).ok());
  EXPECT_EQ(c.mps, "off");
  EXPECT_EQ(c.cuda_graph_max_batch, 32);
  ASSERT_TRUE(LoadClusterConfig(Write("graphs.yaml", "cuda_graph_max_batch: 0\n"), c).ok());
  EXPECT_EQ(c.cuda_graph_max_batch, 0);
  EXPECT_THAT(message("cuda_graph_max_batch: -1\n"),
              HasSubstr("bad value for \"cuda_graph_max_batch\""));
  EXPECT_THAT(message("cuda_graph_max_batch: 65\n"),
              HasSubstr("bad value for \"cuda_graph_max_batch\""));
}

TEST(ClusterConfigTest, Errors) {
  ClusterConfig c;
  auto message = [&](const std::string& text) {
    return std::string(LoadClusterConfig(Write("bad.yaml", text), c).message());
  };
  EXPECT_THAT(message("hot_ratiox: 1\n"), HasSubstr("unknown key \"hot_ratiox\""));
  EXPECT_THAT(message("kv_cache:\n  blocksize: 3\n"),
              HasSubstr("unknown key \"kv_cache.blocksize\""));
  EXPECT_THAT(message("workers: many\n"), HasSubstr("bad value for \"workers\""));
  EXPECT_THAT(message("gate_temperature: 0\n"), HasSubstr("bad value for \"gate_temperature\""));
  EXPECT_THAT(message("router_temperature: 0\n"),
              HasSubstr("bad value for \"router_temperature\""));
  EXPECT_THAT(message("transport: carrier-pigeon\n"), HasSubstr("bad value for \"transport\""));
  EXPECT_THAT(message("[1, 2]\n"), HasSubstr("not a mapping"));
  EXPECT_THAT(message("a: [\n"), HasSubstr("bad.yaml"));
  EXPECT_EQ(LoadClusterConfig("/nonexistent.yaml", c).code(), absl::StatusCode::kNotFound);
}

// The merged config (file, then flags) is checked by the same rules the file's keys are read
// with; the error names the key and the flag that sets it.
TEST(ClusterConfigTest, CheckNamesTheKeyAndItsFlag) {
  EXPECT_TRUE(CheckClusterConfig(ClusterConfig()).ok());
  auto message = [](const std::function<void(ClusterConfig&)>& change) {
    ClusterConfig c;
    change(c);
    return CheckClusterConfig(c).ToString();
  };
  EXPECT_THAT(message([](ClusterConfig& c) { c.hot_ratio = "1.5"; }),
              HasSubstr("bad value for \"hot_ratio\" (--hot-ratio)"));
  EXPECT_THAT(message([](ClusterConfig& c) { c.cache_policy = "mru"; }),
              HasSubstr("(--cache-policy): must be one of lru, lfu"));
  EXPECT_THAT(message([](ClusterConfig& c) { c.transport = "pigeon"; }),
              HasSubstr("(--transport)"));
  EXPECT_THAT(message([](ClusterConfig& c) { c.weights = "int4"; }), HasSubstr("(--weights)"));
  EXPECT_THAT(message([](ClusterConfig& c) { c.device = "tpu"; }), HasSubstr("(--device)"));
  EXPECT_THAT(message([](ClusterConfig& c) { c.expert_store = "mmap"; }),
              HasSubstr("(--expert-store): must be one of copy, in-place"));
  EXPECT_THAT(message([](ClusterConfig& c) { c.workers = 0; }),
              HasSubstr("bad value for \"workers\" (--workers)"));
  EXPECT_THAT(message([](ClusterConfig& c) { c.kv.block_size = 0; }),
              HasSubstr("\"kv_cache.block_size\" (--kv-block-size)"));
  EXPECT_THAT(message([](ClusterConfig& c) { c.cuda_graph_max_batch = 65; }),
              HasSubstr("must be in [0, 64]"));
  EXPECT_THAT(message([](ClusterConfig& c) { c.hot_ratio_policy = "x"; }),
              HasSubstr("bad value for \"hot_ratio_policy\" (--hot-ratio-policy): "));
  EXPECT_THAT(message([](ClusterConfig& c) { c.log_level = "loud"; }), HasSubstr("(--log-level)"));
  // A GPU router needs workers that share its buffers.
  EXPECT_THAT(message([](ClusterConfig& c) { c.router_device = "cuda:0"; }),
              HasSubstr("router_device cuda:0 needs workers"));
}

// The router goes on GPU 0 for GPU workers that can share its buffers (CUDA IPC), stays on
// the CPU otherwise, and router_device overrides that only where it can work.
// Unset, the step size follows where the router runs: long prompts in 4,096-token chunks on a
// GPU, 512 on the CPU; a configured size is kept.
TEST(ClusterConfigTest, StepSizeFollowsTheRouterDevice) {
  ClusterConfig c;
  EXPECT_EQ(c.max_batch_tokens, 0);
  EXPECT_EQ(DefaultMaxBatchTokens(*RouterDevice(c)), 512);
  c.device = "cuda";
  EXPECT_EQ(DefaultMaxBatchTokens(*RouterDevice(c)), 4096);
  EXPECT_TRUE(CheckClusterConfig(c).ok());
  c.max_batch_tokens = -1;
  EXPECT_THAT(std::string(CheckClusterConfig(c).message()), HasSubstr("max-batch-tokens"));
}

TEST(ClusterConfigTest, RouterDevice) {
  ClusterConfig c;
  EXPECT_EQ(*RouterDevice(c), "cpu");
  c.device = "cuda";
  EXPECT_EQ(*RouterDevice(c), "cuda:0");
  c.router_device = "cuda:1";
  EXPECT_EQ(*RouterDevice(c), "cuda:1");
  c.router_device = "cpu";
  EXPECT_EQ(*RouterDevice(c), "cpu");
  c.router_device.clear();
  c.gpu_memory_budget = "8GiB";  // tiered workers on GPUs take CUDA IPC too
  EXPECT_EQ(*RouterDevice(c), "cuda:0");
  c.cold_experts = "cpu";  // the workers hand strata-expert-store's CPUs the rows themselves
  EXPECT_EQ(*RouterDevice(c), "cuda:0");
  c.cold_experts = "split";
  EXPECT_EQ(*RouterDevice(c), "cuda:0");
  c.cold_experts = "auto";
  c.gpu_memory_budget.clear();
  c.transport = "grpc";
  c.router_device = "cuda";
  EXPECT_THAT(std::string(RouterDevice(c).status().message()), HasSubstr("CUDA IPC"));
  c.router_device.clear();
  c.transport = "shm";
  EXPECT_EQ(*RouterDevice(c), "cuda:0");
  c.router_device = "gpu0";
  EXPECT_EQ(RouterDevice(c).status().code(), absl::StatusCode::kInvalidArgument);

  ClusterConfig from_file;
  auto write = [](const std::string& text) {
    const std::string path = ::testing::TempDir() + "/router_device.yaml";
    std::ofstream(path) << text;
    return path;
  };
  ASSERT_TRUE(LoadClusterConfig(write("device: cuda\nrouter_device: cuda:1\n"), from_file).ok());
  EXPECT_EQ(from_file.router_device, "cuda:1");
  EXPECT_THAT(std::string(LoadClusterConfig(write("router_device: tpu\n"), from_file).message()),
              HasSubstr("bad value for \"router_device\""));
}

TEST(ClusterConfigTest, FlagsOverrideTheFileByTheKeysTable) {
  ClusterConfig c;
  ASSERT_TRUE(LoadClusterConfig(Write("f.yaml", "workers: 3\nprefetch: true\n"), c).ok());
  ASSERT_TRUE(ApplyClusterFlags({"--workers=2", "--kv-cache-mb", "2048", "--noprefetch",
                                 "--overlap_steps=false", "--gpu-memory-budget=24GiB"},
                                c)
                  .ok());
  EXPECT_EQ(c.workers, 2);
  EXPECT_EQ(c.kv.memory_mb, 2048);
  EXPECT_FALSE(c.prefetch);
  EXPECT_FALSE(c.overlap_steps);
  EXPECT_EQ(c.gpu_memory_budget, "24GiB");
  auto message = [](std::vector<std::string> args) {
    ClusterConfig c;
    return std::string(ApplyClusterFlags(args, c).message());
  };
  EXPECT_THAT(message({"--max-runing=3"}), HasSubstr("did you mean --max-running?"));
  EXPECT_THAT(message({"--workers"}), HasSubstr("--workers needs a value"));
  EXPECT_THAT(message({"--workers=two"}), HasSubstr("not of its type"));
  EXPECT_THAT(message({"model"}), HasSubstr("unexpected argument"));
  EXPECT_THAT(message({"--zzzzzzzzzz"}), Not(HasSubstr("did you mean")));
}

TEST(ClusterConfigTest, EachDaemonGetsItsKeys) {
  ClusterConfig c;
  c.model = "/m";
  c.kv.memory_mb = 4096;
  c.gpu_memory_budget = "8GiB";
  c.expert_store = "in-place";
  ASSERT_TRUE(ApplyClusterFlags({"--http-port", "8000"}, c).ok());
  auto has = [](const std::vector<std::string>& args, const std::string& arg) {
    return std::find(args.begin(), args.end(), arg) != args.end();
  };
  const auto store = DaemonArgs(c, Daemon::kExpertStore);
  const auto router = DaemonArgs(c, Daemon::kRouter);
  const auto worker = DaemonArgs(c, Daemon::kWorker);
  for (const auto* args : {&store, &router, &worker}) EXPECT_TRUE(has(*args, "--model=/m"));
  EXPECT_TRUE(has(store, "--expert-store=in-place"));
  EXPECT_TRUE(has(router, "--kv-cache-mb=4096"));
  EXPECT_TRUE(has(router, "--cuda-graph-max-batch=32"));
  EXPECT_TRUE(has(router, "--prefetch=true"));
  EXPECT_TRUE(has(router, "--http-port=8000"));
  EXPECT_FALSE(has(worker, "--http-port=8000"));
  EXPECT_TRUE(has(worker, "--gpu-memory-budget=8GiB"));
  EXPECT_FALSE(has(worker, "--kv-cache-mb=4096"));
  EXPECT_FALSE(has(router, "--gpu-memory-budget=8GiB"));
  for (const auto* args : {&store, &router, &worker}) {
    for (const std::string& a : *args) EXPECT_EQ(a.find("--mps"), std::string::npos) << a;
  }
}

// The HTTP API's name goes to the router as a flag; its key goes to no command line (the
// supervisor sets it in the router's environment) and a bad one is refused without repeating it.
TEST(ClusterConfigTest, ServedModelNameAndApiKey) {
  ClusterConfig c;
  ASSERT_TRUE(
      LoadClusterConfig(Write("http.yaml", "served_model_name: demo\napi_key: sk-file\n"), c).ok());
  EXPECT_EQ(c.served_model_name, "demo");
  EXPECT_EQ(c.api_key, "sk-file");
  ASSERT_TRUE(
      ApplyClusterFlags({"--api-key", "sk-flag-123", "--served-model-name=org/model"}, c).ok());
  EXPECT_EQ(c.api_key, "sk-flag-123");
  EXPECT_TRUE(CheckClusterConfig(c).ok());
  const auto router = DaemonArgs(c, Daemon::kRouter);
  EXPECT_NE(std::find(router.begin(), router.end(), "--served-model-name=org/model"), router.end());
  for (const Daemon daemon : {Daemon::kExpertStore, Daemon::kRouter, Daemon::kWorker}) {
    for (const std::string& arg : DaemonArgs(c, daemon)) {
      EXPECT_THAT(arg, Not(HasSubstr("sk-flag-123")));
      EXPECT_THAT(arg, Not(HasSubstr("api-key")));
    }
  }
  for (const std::string& bad : {std::string("has space"), std::string(1025, 'k')}) {
    c.api_key = bad;
    const std::string message = CheckClusterConfig(c).ToString();
    EXPECT_THAT(message, HasSubstr("bad value for \"api_key\" (--api-key): must be 1 to 1024"));
    EXPECT_THAT(message, Not(HasSubstr(bad)));
  }
}

}  // namespace
}  // namespace strata
