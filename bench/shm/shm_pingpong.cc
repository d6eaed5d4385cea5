// Round-trip latency and throughput of a ShmChannel between this process (the "router")
// and a forked echo peer (the "worker"), for activation-sized payloads.
//
//   shm_pingpong [--out=results.json] [--iters=N] [--spin_us=50] [--slots=8]
//                [--sizes=64,8192,262144] [--cpus=ROUTER_CPU,WORKER_CPU]
//
// One round trip = router copies the payload into a request slot and commits; the worker
// copies it into a response slot and commits; the router copies the response out. The
// copies are part of the measurement, as they are part of a forward pass. "pipelined" keeps
// up to `slots` requests in flight instead of one. First, as a floor for the same pair of
// processes and CPUs, it times a bare ping-pong of one 64-bit word each way (two cache-line
// transfers per round trip; virtualized hosts vary several-fold from run to run).
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/shm/channel.h"
#include "common/shm/futex.h"
#include "nlohmann/json.hpp"

namespace strata {
namespace {

using Clock = std::chrono::steady_clock;

struct Flags {
  std::string out;
  int64_t iters = 0;  // 0: per-size defaults
  uint32_t spin_us = 50;
  uint32_t slots = 8;
  std::vector<uint64_t> sizes = {64, 8192, 262144};
  int router_cpu = -1;
  int worker_cpu = -1;
};

struct Result {
  uint64_t bytes = 0;
  int64_t iters = 0;
  double p50_us = 0, p90_us = 0, p99_us = 0, p999_us = 0, max_us = 0, mean_us = 0;
  double pingpong_per_s = 0;
  double pipelined_per_s = 0;
  double pipelined_gbps = 0;  // payload GB/s in each direction
};

[[noreturn]] void Usage(const std::string& error) {
  std::fprintf(stderr,
               "%s\nusage: shm_pingpong [--out=FILE.json] [--iters=N] [--spin_us=US] "
               "[--slots=N] [--sizes=B,B,...] [--cpus=ROUTER,WORKER]\n",
               error.c_str());
  std::exit(2);
}

Flags ParseFlags(int argc, char** argv) {
  Flags flags;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    std::string value;
    const size_t eq = arg.find('=');
    if (eq != std::string::npos) {
      value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
    } else if (i + 1 < argc) {
      value = argv[++i];
    }
    bool ok = true;
    if (arg == "--out") {
      flags.out = value;
    } else if (arg == "--iters") {
      ok = absl::SimpleAtoi(value, &flags.iters) && flags.iters > 0;
    } else if (arg == "--spin_us") {
      ok = absl::SimpleAtoi(value, &flags.spin_us);
    } else if (arg == "--slots") {
      ok = absl::SimpleAtoi(value, &flags.slots) && flags.slots > 0;
    } else if (arg == "--sizes") {
      flags.sizes.clear();
      for (absl::string_view s : absl::StrSplit(value, ',')) {
        uint64_t n = 0;
        ok = ok && absl::SimpleAtoi(s, &n) && n > 0;
        flags.sizes.push_back(n);
      }
    } else if (arg == "--cpus") {
      std::vector<std::string> cpus = absl::StrSplit(value, ',');
      ok = cpus.size() == 2 && absl::SimpleAtoi(cpus[0], &flags.router_cpu) &&
           absl::SimpleAtoi(cpus[1], &flags.worker_cpu);
    } else {
      Usage("unknown flag " + arg);
    }
    if (!ok) Usage("bad value for " + arg);
  }
  return flags;
}

void Pin(int cpu) {
  if (cpu < 0) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  if (sched_setaffinity(0, sizeof(set), &set) != 0) std::perror("sched_setaffinity");
}

void Check(const absl::Status& status, const char* what) {
  if (!status.ok()) {
    std::fprintf(stderr, "%s: %s\n", what, status.ToString().c_str());
    std::exit(1);
  }
}

// The floor: one word each way, in a page shared across fork().
struct RawPingPong {
  static constexpr int64_t kBatch = 100;
  static constexpr int64_t kBatches = 2000;
  alignas(128) std::atomic<uint64_t> ping{0};
  alignas(128) std::atomic<uint64_t> pong{0};

  void Pong() {
    for (uint64_t i = 1; i <= kBatch * kBatches; ++i) {
      while (ping.load(std::memory_order_acquire) != i) shm_internal::CpuRelax();
      pong.store(i, std::memory_order_release);
    }
  }
  // Median over batches of the mean round trip, in us: robust to preemption.
  double Ping() {
    std::vector<double> per_batch;
    uint64_t i = 1;
    for (int64_t b = 0; b < kBatches; ++b) {
      const Clock::time_point t0 = Clock::now();
      for (int64_t k = 0; k < kBatch; ++k, ++i) {
        ping.store(i, std::memory_order_release);
        while (pong.load(std::memory_order_acquire) != i) shm_internal::CpuRelax();
      }
      per_batch.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count() /
                          kBatch);
    }
    std::sort(per_batch.begin(), per_batch.end());
    return per_batch[per_batch.size() / 2];
  }
};

// The worker: the floor ping-pong, then echo until the router closes the channel.
int Echo(const std::string& name, int cpu, RawPingPong* raw) {
  Pin(cpu);
  auto ch = ShmChannel::Open(name, {.wait_for_creator = absl::Seconds(10)});
  if (!ch.ok()) return 10;
  raw->Pong();
  for (;;) {
    auto in = ch->inbound().Peek(absl::InfiniteDuration());
    if (absl::IsCancelled(in.status())) return 0;
    if (!in.ok()) return 11;
    auto out = ch->outbound().Reserve(in->size(), absl::InfiniteDuration());
    if (!out.ok()) return absl::IsCancelled(out.status()) ? 0 : 12;
    std::memcpy(out->data(), in->data(), in->size());
    if (!ch->outbound().Commit(in->size()).ok() || !ch->inbound().Pop().ok()) return 13;
  }
}

void Send(ShmChannel& ch, const std::vector<uint8_t>& src, uint64_t bytes) {
  auto out = ch.outbound().Reserve(bytes, absl::Seconds(10));
  Check(out.status(), "Reserve");
  std::memcpy(out->data(), src.data(), bytes);
  Check(ch.outbound().Commit(bytes), "Commit");
}

void Receive(ShmChannel& ch, std::vector<uint8_t>& dst, uint64_t bytes) {
  auto in = ch.inbound().Peek(absl::Seconds(10));
  Check(in.status(), "Peek");
  if (in->size() != bytes) Check(absl::DataLossError("echo has the wrong size"), "Peek");
  std::memcpy(dst.data(), in->data(), in->size());
  Check(ch.inbound().Pop(), "Pop");
}

double Percentile(const std::vector<int64_t>& sorted_ns, double q) {
  const size_t i = std::min(sorted_ns.size() - 1, static_cast<size_t>(q * sorted_ns.size()));
  return sorted_ns[i] / 1e3;
}

Result Measure(ShmChannel& ch, uint64_t bytes, int64_t iters, uint32_t slots) {
  std::vector<uint8_t> src(bytes), dst(bytes);
  for (uint64_t i = 0; i < bytes; ++i) src[i] = static_cast<uint8_t>(i * 31 + 7);
  for (int64_t i = 0; i < std::max<int64_t>(200, iters / 10); ++i) {  // warm caches and TLB
    Send(ch, src, bytes);
    Receive(ch, dst, bytes);
  }
  std::vector<int64_t> ns(iters);
  const Clock::time_point begin = Clock::now();
  for (int64_t i = 0; i < iters; ++i) {
    const Clock::time_point t0 = Clock::now();
    Send(ch, src, bytes);
    Receive(ch, dst, bytes);
    ns[i] = std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count();
  }
  const double total_s = std::chrono::duration<double>(Clock::now() - begin).count();
  if (std::memcmp(src.data(), dst.data(), bytes) != 0) {
    Check(absl::DataLossError("echo differs from the request"), "verify");
  }

  Result r;
  r.bytes = bytes;
  r.iters = iters;
  std::vector<int64_t> sorted = ns;
  std::sort(sorted.begin(), sorted.end());
  r.p50_us = Percentile(sorted, 0.50);
  r.p90_us = Percentile(sorted, 0.90);
  r.p99_us = Percentile(sorted, 0.99);
  r.p999_us = Percentile(sorted, 0.999);
  r.max_us = sorted.back() / 1e3;
  double sum = 0;
  for (int64_t v : ns) sum += v;
  r.mean_us = sum / iters / 1e3;
  r.pingpong_per_s = iters / total_s;

  // Pipelined: up to `slots` requests in flight.
  const Clock::time_point p0 = Clock::now();
  int64_t sent = 0;
  for (int64_t received = 0; received < iters; ++received) {
    while (sent < iters && sent - received < slots) {
      Send(ch, src, bytes);
      ++sent;
    }
    Receive(ch, dst, bytes);
  }
  const double pipe_s = std::chrono::duration<double>(Clock::now() - p0).count();
  r.pipelined_per_s = iters / pipe_s;
  r.pipelined_gbps = r.pipelined_per_s * bytes / 1e9;
  return r;
}

int64_t DefaultIters(uint64_t bytes) {
  if (bytes <= 4096) return 200000;
  if (bytes <= 65536) return 50000;
  return 5000;
}

std::string HumanBytes(uint64_t b) {
  if (b >= (1 << 20) && b % (1 << 20) == 0) return absl::StrCat(b >> 20, " MiB");
  if (b >= 1024 && b % 1024 == 0) return absl::StrCat(b >> 10, " KiB");
  return absl::StrCat(b, " B");
}

int Main(int argc, char** argv) {
  const Flags flags = ParseFlags(argc, argv);
  const uint64_t max_bytes = *std::max_element(flags.sizes.begin(), flags.sizes.end());
  const std::string name = absl::StrCat("strata_pingpong_", ::getpid());
  auto ch = ShmChannel::Create(
      name, {.slots = flags.slots, .slot_bytes = max_bytes, .spin_us = flags.spin_us});
  Check(ch.status(), "ShmChannel::Create");

  void* page = ::mmap(nullptr, sizeof(RawPingPong), PROT_READ | PROT_WRITE,
                      MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (page == MAP_FAILED) Check(absl::InternalError("mmap failed"), "mmap");
  auto* raw = new (page) RawPingPong();

  const pid_t child = ::fork();
  if (child < 0) Check(absl::InternalError("fork failed"), "fork");
  if (child == 0) ::_exit(Echo(name, flags.worker_cpu, raw));
  Pin(flags.router_cpu);
  Check(ch->WaitForPeer(absl::Seconds(10)), "WaitForPeer");
  const double floor_us = raw->Ping();

  std::printf("shm_pingpong: spin_us=%u slots=%u, router on cpu %d, worker pid %d%s, %ld cpus\n",
              flags.spin_us, flags.slots, sched_getcpu(), static_cast<int>(child),
              flags.worker_cpu >= 0 ? absl::StrCat(" on cpu ", flags.worker_cpu).c_str() : "",
              sysconf(_SC_NPROCESSORS_ONLN));
  std::printf("floor (1-word ping-pong, same processes and cpus): %.3f us round trip\n", floor_us);
  std::printf("%-10s %8s %9s %9s %9s %9s %9s %12s %12s %10s\n", "payload", "iters", "p50_us",
              "p90_us", "p99_us", "p99.9_us", "mean_us", "pingpong/s", "pipelined/s", "pipe_GB/s");
  std::vector<Result> results;
  for (uint64_t bytes : flags.sizes) {
    const Result r =
        Measure(*ch, bytes, flags.iters > 0 ? flags.iters : DefaultIters(bytes), flags.slots);
    std::printf("%-10s %8ld %9.2f %9.2f %9.2f %9.2f %9.2f %12.0f %12.0f %10.2f\n",
                HumanBytes(bytes).c_str(), r.iters, r.p50_us, r.p90_us, r.p99_us, r.p999_us,
                r.mean_us, r.pingpong_per_s, r.pipelined_per_s, r.pipelined_gbps);
    std::fflush(stdout);
    results.push_back(r);
  }

  ch->Close();
  int status = 0;
  ::waitpid(child, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::fprintf(stderr, "worker failed (status %d)\n", status);
    return 1;
  }

  if (!flags.out.empty()) {
    nlohmann::json json;
    json["benchmark"] = "shm_pingpong";
    json["config"] = {{"spin_us", flags.spin_us},
                      {"slots", flags.slots},
                      {"router_cpu", flags.router_cpu},
                      {"worker_cpu", flags.worker_cpu},
                      {"online_cpus", sysconf(_SC_NPROCESSORS_ONLN)}};
    json["floor_rtt_us"] = floor_us;
    for (const Result& r : results) {
      json["results"].push_back({{"payload_bytes", r.bytes},
                                 {"iters", r.iters},
                                 {"rtt_us",
                                  {{"p50", r.p50_us},
                                   {"p90", r.p90_us},
                                   {"p99", r.p99_us},
                                   {"p99_9", r.p999_us},
                                   {"max", r.max_us},
                                   {"mean", r.mean_us}}},
                                 {"pingpong_round_trips_per_s", r.pingpong_per_s},
                                 {"pipelined_round_trips_per_s", r.pipelined_per_s},
                                 {"pipelined_payload_gb_per_s_each_way", r.pipelined_gbps}});
    }
    std::ofstream file(flags.out);
    file << json.dump(2) << "\n";
    file.close();
    if (!file) {
      std::fprintf(stderr, "cannot write %s\n", flags.out.c_str());
      return 1;
    }
    std::printf("wrote %s\n", flags.out.c_str());
  }
  return 0;
}

}  // namespace
}  // namespace strata

int main(int argc, char** argv) { return strata::Main(argc, argv); }
