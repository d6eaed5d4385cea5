// Not a test: the figures behind ColdPathOptions' defaults (services/expert-worker/
// cold_path_model.h), measured on this host:
//   1. memcpy bandwidth, one thread and --threads threads, over buffers far larger than the
//      last-level cache (what a staged, unpinned host copy of an expert runs at);
//   2. CpuExpertBackend on one bf16 expert of --hidden x --intermediate for 1..256 tokens,
//      cycling over enough experts that every call reads its weights from DRAM, fitted to
//      time = bytes / cpu_bytes_per_s + tokens * 6 * hidden * intermediate / cpu_flops;
//   3. with --model, the CPU tier's fixed cost: round trips of a one-token request with no
//      expert of its own through a ExpertStoreServer and a CpuTierClient in this process, back to
//      back (both sides spinning) and 1 ms apart (the store's thread asleep, as between the
//      layers of a real step).
//
//   cold_path_bench [--hidden 2048 --intermediate 768] [--fp8] [--threads 0] [--model DIR]
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/backend/cpu/cpu_expert_backend.h"
#include "services/expert-store/expert_store_server.h"
#include "services/expert-worker/cpu_tier_client.h"

ABSL_FLAG(int64_t, hidden, 2048, "Expert input size (default: Qwen3-30B-A3B)");
ABSL_FLAG(int64_t, intermediate, 768, "Expert intermediate size");
ABSL_FLAG(int, threads, 0, "Threads for the experts and the parallel memcpy; 0: all");
ABSL_FLAG(int64_t, memcpy_mib, 512, "Buffer size of the memcpy test");
ABSL_FLAG(bool, fp8, false, "FP8 E4M3 experts with row scales instead of bf16");
ABSL_FLAG(int, max_tokens, 256, "Largest token count measured");
ABSL_FLAG(std::string, model, "", "Model for the CPU tier round trip (skipped without)");

namespace strata {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// Best of `reps` of fn(), in seconds: the least disturbed run on a shared machine.
template <typename Fn>
double Best(int reps, Fn fn) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const auto start = Clock::now();
    fn();
    best = std::min(best, Seconds(Clock::now() - start));
  }
  return best;
}

void MemcpyBandwidth(int threads) {
  const size_t bytes = static_cast<size_t>(absl::GetFlag(FLAGS_memcpy_mib)) << 20;
  std::vector<uint8_t> src(bytes, 1), dst(bytes, 0);  // touched: no page faults timed
  const double one = Best(5, [&] { std::memcpy(dst.data(), src.data(), bytes); });
  const double many = Best(5, [&] {
    std::vector<std::thread> workers;
    const size_t part = bytes / threads;
    for (int t = 0; t < threads; ++t) {
      workers.emplace_back(
          [&, t] { std::memcpy(dst.data() + t * part, src.data() + t * part, part); });
    }
    for (auto& w : workers) w.join();
  });
  std::printf("memcpy %zu MiB: 1 thread %.2f GB/s, %d threads %.2f GB/s\n", bytes >> 20,
              bytes / one / 1e9, threads, bytes / many / 1e9);
}

// `count` experts, each one contiguous gate, up and down, all in one layer: bf16, or FP8 E4M3
// with float row scales (the store's FP8 layout).
class SyntheticExperts : public ExpertWeightSource {
 public:
  SyntheticExperts(int count, int64_t hidden, int64_t inter, bool fp8) {
    const int64_t per = 3 * hidden * inter;
    const int64_t width = fp8 ? 1 : 2;
    data_.resize(static_cast<size_t>(count) * per * width);
    scales_.assign(fp8 ? static_cast<size_t>(count) * (2 * inter + hidden) : 0, 1.0f / 256);
    std::mt19937 rng(1);
    std::uniform_int_distribution<uint16_t> mantissa(0, 0x7f);
    for (int64_t i = 0; i < static_cast<int64_t>(data_.size()) / width; ++i) {
      if (fp8) {
        // Codes of magnitude [1, 2) (exponent field 7) with random sign and mantissa.
        data_[i] = static_cast<uint8_t>(0x38 | (mantissa(rng) & 7) | (rng() & 1) << 7);
      } else {
        // Small bf16 values (+-[2^-8, 2^-7)) so SiLU and the sums stay finite.
        const uint16_t v = static_cast<uint16_t>(0x3b80 | mantissa(rng) | (rng() & 1) << 15);
        std::memcpy(&data_[2 * i], &v, 2);
      }
    }
    const DType dtype = fp8 ? DType::kF8E4M3 : DType::kBF16;
    for (int e = 0; e < count; ++e) {
      const uint8_t* base = data_.data() + e * per * width;
      const float* scale = fp8 ? scales_.data() + e * (2 * inter + hidden) : nullptr;
      FfnWeights f;
      f.gate = WeightMatrix{base, dtype, inter, hidden, hidden, 1, scale};
      f.up = WeightMatrix{base + hidden * inter * width, dtype, inter, hidden, hidden, 1,
                          fp8 ? scale + inter : nullptr};
      f.down = WeightMatrix{base + 2 * hidden * inter * width, dtype, hidden, inter, inter, 1,
                            fp8 ? scale + 2 * inter : nullptr};
      experts_.push_back(f);
    }
  }
  const FfnWeights* Find(int layer, int expert) const override {
    return layer == 0 && expert < static_cast<int>(experts_.size()) ? &experts_[expert] : nullptr;
  }

 private:
  std::vector<uint8_t> data_;
  std::vector<float> scales_;
  std::vector<FfnWeights> experts_;
};

void ExpertThroughput(int threads) {
  const int64_t h = absl::GetFlag(FLAGS_hidden), inter = absl::GetFlag(FLAGS_intermediate);
  const bool fp8 = absl::GetFlag(FLAGS_fp8);
  const double expert_bytes = 3.0 * h * inter * (fp8 ? 1 : 2);
  // Four times a 32 MiB last-level cache at least, so each call streams from DRAM.
  const int count = std::max(2, static_cast<int>(std::ceil(4.0 * (32 << 20) / expert_bytes)));
  SyntheticExperts experts(count, h, inter, fp8);
  ModelConfig config;
  config.hidden_size = h;
  config.moe_intermediate_size = inter;
  config.num_layers = 1;
  config.num_experts = count;
  config.top_k = 1;
  config.layer_is_moe = {true};
  ThreadPool pool(threads);
  CpuExpertBackend backend(config, experts, pool);
  std::printf(
      "CpuExpertBackend, one %s expert %lld x %lld (%.2f MiB), %d threads, "
      "weights from DRAM (%d experts cycled):\n",
      fp8 ? "FP8" : "bf16", static_cast<long long>(h), static_cast<long long>(inter),
      expert_bytes / 1048576, pool.num_threads(), count);
  std::vector<double> xs, ys;
  std::mt19937 rng(2);
  std::normal_distribution<float> normal;
  Tensor out;
  int next = 0;
  for (int64_t tokens : {1, 2, 4, 8, 16, 32, 64, 128, 256}) {
    if (tokens > absl::GetFlag(FLAGS_max_tokens)) break;
    Tensor x = Tensor::Host(tokens, h);
    for (int64_t i = 0; i < x.size(); ++i) x.data()[i] = normal(rng);
    RoutingTable routing;
    routing.Resize(tokens, 1);
    std::fill(routing.weight.begin(), routing.weight.end(), 1.0f);
    const int reps = tokens <= 16 ? 4 * count : std::max(3, count / 4);
    std::vector<double> times;
    for (int r = 0; r < reps; ++r) {
      std::fill(routing.expert.begin(), routing.expert.end(), next);
      next = (next + 1) % count;
      const auto start = Clock::now();
      if (!backend.RunExperts(0, x, routing, out).ok()) std::abort();
      times.push_back(Seconds(Clock::now() - start));
    }
    std::sort(times.begin(), times.end());
    const double t = times[times.size() / 2];
    xs.push_back(static_cast<double>(tokens));
    ys.push_back(t);
    std::printf("  %4lld tokens: %9.1f us  (%.2f GB/s of weights, %.2f GFLOP/s)\n",
                static_cast<long long>(tokens), t * 1e6, expert_bytes / t / 1e9,
                tokens * 6.0 * h * inter / t / 1e9);
  }
  if (xs.size() < 3) return;  // too few counts to fit
  // t = bytes / cpu_bytes_per_s + tokens * 6 h i / cpu_flops, least squares in relative
  // error (weights 1 / t^2) so that the small counts, where the CPU path can win, count as
  // much as the large ones.
  double sw = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    const double w = 1.0 / (ys[i] * ys[i]);
    sw += w;
    sx += w * xs[i];
    sy += w * ys[i];
    sxx += w * xs[i] * xs[i];
    sxy += w * xs[i] * ys[i];
  }
  const double b = (sw * sxy - sx * sy) / (sw * sxx - sx * sx);
  const double a = std::max((sy - b * sx) / sw, 1e-9);
  std::printf("  fit: %.1f us + %.2f us/token -> cpu_bytes_per_s %.3g, cpu_flops %.3g\n", a * 1e6,
              b * 1e6, expert_bytes / a, 6.0 * h * inter / b);
  for (size_t i = 0; i < xs.size(); ++i) {
    std::printf("  %4.0f tokens: fit %+.0f%%\n", xs[i], ((a + b * xs[i]) / ys[i] - 1) * 100);
  }
}

void RoundTrip(const std::string& model, int threads) {
  ExpertStoreServerOptions options;
  options.model_dir = model;
  options.store.segment_prefix = absl::StrCat("strata_cold_path_bench_", ::getpid());
  options.store.bind_numa = false;
  options.cpu_tier.num_threads = threads;
  auto server = ExpertStoreServer::Start(options);
  if (!server.ok()) {
    std::printf("round trip: %s\n", std::string(server.status().message()).c_str());
    return;
  }
  auto config = LoadModelConfig(model);
  int layer = 0;
  while (!config->layer_is_moe[layer]) ++layer;
  const int h = static_cast<int>(config->hidden_size), k = config->top_k;
  auto client = CpuTierClient::Connect((*server)->address(), "strata_cold_path_bench", 1, k, h);
  if (!client.ok()) {
    std::printf("round trip: %s\n", std::string(client.status().message()).c_str());
    return;
  }
  std::vector<float> hidden(h, 0.5f), weights(k, 0.0f);
  std::vector<int32_t> experts(k, -1);
  ExpertRequestView request;
  request.layer = layer;
  request.num_tokens = 1;
  request.top_k = k;
  request.hidden_size = h;
  request.hidden = hidden;
  request.experts = experts;
  request.weights = weights;
  Tensor partial;
  for (absl::Duration gap : {absl::ZeroDuration(), absl::Milliseconds(1)}) {
    std::vector<double> times;
    for (int i = 0; i < (gap == absl::ZeroDuration() ? 2000 : 500); ++i) {
      absl::SleepFor(gap);
      const auto start = Clock::now();
      if (!(*client)->Submit(request).ok() ||
          !(*client)->Collect(partial, absl::Seconds(10)).ok()) {
        std::abort();
      }
      times.push_back(Seconds(Clock::now() - start));
    }
    std::sort(times.begin(), times.end());
    std::printf(
        "CPU tier round trip, 1 token, no expert (hidden %d), %s: p50 %.1f us, "
        "p90 %.1f us, p99 %.1f us\n",
        h, gap == absl::ZeroDuration() ? "back to back" : "1 ms apart",
        times[times.size() / 2] * 1e6, times[times.size() * 9 / 10] * 1e6,
        times[times.size() * 99 / 100] * 1e6);
  }
}

}  // namespace
}  // namespace strata

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  int threads = absl::GetFlag(FLAGS_threads);
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  strata::MemcpyBandwidth(threads);
  strata::ExpertThroughput(threads);
  if (!absl::GetFlag(FLAGS_model).empty()) strata::RoundTrip(absl::GetFlag(FLAGS_model), threads);
  return 0;
}
