#include "tests/common/backend/cuda_test_util.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "common/cuda/cuda_status.h"

namespace strata::testing_cuda {
namespace {

struct ResultRow {
  std::string op;
  std::string shape;
  double error;
  double tol;
};

std::vector<ResultRow>& Results() {
  static auto* rows = new std::vector<ResultRow>();
  return *rows;
}

// Ratio of error to tolerance; exact checks (tol 0) count any error as a failure.
double Badness(const ResultRow& r) {
  if (r.tol == 0.0) return r.error == 0.0 ? 0.0 : INFINITY;
  return r.error / r.tol;
}

// After all tests: one line per op (its worst case), every failing case, and the full table
// into the file named by STRATA_TEST_TABLE when set.
class SummaryEnvironment : public ::testing::Environment {
 public:
  void TearDown() override {
    const std::vector<ResultRow>& rows = Results();
    if (rows.empty()) return;
    std::vector<std::string> ops;
    for (const ResultRow& r : rows) {
      if (std::find(ops.begin(), ops.end(), r.op) == ops.end()) ops.push_back(r.op);
    }
    std::printf("\n%-30s %5s %-50s %9s %7s\n", "op (worst case)", "cases", "shape", "rel err",
                "tol");
    for (const std::string& op : ops) {
      const ResultRow* worst = nullptr;
      int cases = 0;
      for (const ResultRow& r : rows) {
        if (r.op != op) continue;
        ++cases;
        if (worst == nullptr || Badness(r) > Badness(*worst)) worst = &r;
      }
      std::printf("%-30s %5d %-50s %9.2e %7.0e%s\n", op.c_str(), cases, worst->shape.c_str(),
                  worst->error, worst->tol, Badness(*worst) <= 1.0 ? "" : "  FAIL");
    }
    for (const ResultRow& r : rows) {
      if (Badness(r) > 1.0) {
        std::printf("FAILED %s | %s | %.3e > %.0e\n", r.op.c_str(), r.shape.c_str(), r.error,
                    r.tol);
      }
    }
    if (const char* path = std::getenv("STRATA_TEST_TABLE")) {
      if (FILE* f = std::fopen(path, "w")) {
        for (const ResultRow& r : rows) {
          std::fprintf(f, "%s\t%s\t%.6e\t%.0e\n", r.op.c_str(), r.shape.c_str(), r.error, r.tol);
        }
        std::fclose(f);
      }
    }
    std::fflush(stdout);
  }
};

const bool kSummaryRegistered = [] {
  ::testing::AddGlobalTestEnvironment(new SummaryEnvironment());
  return true;
}();

uint64_t BaseSeed() {
  static const uint64_t seed = [] {
    const char* env = std::getenv("STRATA_TEST_SEED");
    const uint64_t s = env != nullptr ? std::strtoull(env, nullptr, 10) : std::random_device{}();
    std::printf("cuda_ops_test base seed %llu (set STRATA_TEST_SEED to repeat)\n",
                static_cast<unsigned long long>(s));
    return s;
  }();
  return seed;
}

// Created on first use and never destroyed: tearing CUDA down during static destruction
// races the runtime's own teardown.
gpu::CudaContext* SharedContext() {
  static gpu::CudaContext* context = nullptr;
  if (context == nullptr) {
    absl::StatusOr<std::unique_ptr<gpu::CudaContext>> made = gpu::CudaContext::Create({});
    if (!made.ok()) {
      ADD_FAILURE() << made.status();
      return nullptr;
    }
    context = made->release();
  }
  return context;
}

}  // namespace

std::vector<float> ToFloat(const std::vector<uint16_t>& bits) {
  std::vector<float> out(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) out[i] = Bf16ToFloat(bits[i]);
  return out;
}

void RecordResult(const std::string& op, const std::string& shape, double error, double tol) {
  Results().push_back({op, shape, error, tol});
}

double RelErr(const std::vector<float>& out, const std::vector<double>& ref) {
  if (out.size() != ref.size()) return INFINITY;
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < out.size(); ++i) {
    if (!std::isfinite(out[i])) return INFINITY;
    const double d = static_cast<double>(out[i]) - ref[i];
    num += d * d;
    den += ref[i] * ref[i];
  }
  if (den == 0.0) return num == 0.0 ? 0.0 : INFINITY;
  return std::sqrt(num / den);
}

double RelErr(const std::vector<float>& out, const std::vector<float>& ref) {
  return RelErr(out, std::vector<double>(ref.begin(), ref.end()));
}

void ExpectClose(const std::string& op, const std::string& shape, const std::vector<float>& out,
                 const std::vector<double>& ref, double tol) {
  const double err = RelErr(out, ref);
  RecordResult(op, shape, err, tol);
  EXPECT_LE(err, tol) << op << " " << shape;
}

void ExpectClose(const std::string& op, const std::string& shape, const std::vector<float>& out,
                 const std::vector<float>& ref, double tol) {
  ExpectClose(op, shape, out, std::vector<double>(ref.begin(), ref.end()), tol);
}

WeightMatrix HostMatrix(const std::vector<uint16_t>& bits, int64_t out, int64_t in) {
  return WeightMatrix{.data = bits.data(),
                      .dtype = DType::kBF16,
                      .out = out,
                      .in = in,
                      .out_stride = in,
                      .in_stride = 1};
}

WeightVector HostVector(const std::vector<uint16_t>& bits) {
  return WeightVector{.data = bits.data(),
                      .dtype = DType::kBF16,
                      .size = static_cast<int64_t>(bits.size()),
                      .stride = 1};
}

void CudaOpsTest::SetUp() {
  if (gpu::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  gpu::CudaContext* shared = SharedContext();
  ASSERT_NE(shared, nullptr);
  shared_ = shared;
  const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
  const std::string name = std::string(info->test_suite_name()) + "." + info->name();
  rng_.seed(BaseSeed() ^ std::hash<std::string>{}(name));
}

void CudaOpsTest::TearDown() {
  for (void* p : allocations_) cudaFree(p);
  allocations_.clear();
}

std::vector<uint16_t> CudaOpsTest::RandomBf16(size_t n, float scale) {
  std::uniform_real_distribution<float> dist(-scale, scale);
  std::vector<uint16_t> out(n);
  for (uint16_t& v : out) v = Bf16(dist(rng_));
  return out;
}

void CudaOpsTest::MakeRandomExpert(int64_t h, int64_t m, bool gpt_oss, HostExpert& e) {
  const float in_scale = (gpt_oss ? 8.0f : 3.0f) / std::sqrt(static_cast<float>(h));
  e.gate_up = RandomBf16(2 * m * h, in_scale);
  e.down = RandomBf16(h * m, 3.0f / std::sqrt(static_cast<float>(m)));
  auto matrix = [](const std::vector<uint16_t>& data, int64_t offset, int64_t out, int64_t in,
                   int64_t out_stride, int64_t in_stride) {
    return WeightMatrix{.data = data.data() + offset,
                        .dtype = DType::kBF16,
                        .out = out,
                        .in = in,
                        .out_stride = out_stride,
                        .in_stride = in_stride};
  };
  if (gpt_oss) {
    e.ffn.gate = matrix(e.gate_up, 0, m, h, 2, 2 * m);
    e.ffn.up = matrix(e.gate_up, 1, m, h, 2, 2 * m);
    e.ffn.down = matrix(e.down, 0, h, m, 1, h);
    e.gate_up_bias = RandomBf16(2 * m, 0.5f);
    e.down_bias = RandomBf16(h, 0.5f);
    e.ffn.gate_bias = WeightVector{.data = e.gate_up_bias.data(), .size = m, .stride = 2};
    e.ffn.up_bias = WeightVector{.data = e.gate_up_bias.data() + 1, .size = m, .stride = 2};
    e.ffn.down_bias = HostVector(e.down_bias);
  } else {
    e.ffn.gate = matrix(e.gate_up, 0, m, h, h, 1);
    e.ffn.up = matrix(e.gate_up, m * h, m, h, h, 1);
    e.ffn.down = matrix(e.down, 0, h, m, m, 1);
  }
}

std::vector<float> CudaOpsTest::RandomFloats(size_t n, float scale) {
  std::uniform_real_distribution<float> dist(-scale, scale);
  std::vector<float> out(n);
  for (float& v : out) v = dist(rng_);
  return out;
}

int CudaOpsTest::RandomInt(int lo, int hi) {
  return std::uniform_int_distribution<int>(lo, hi)(rng_);
}

void* CudaOpsTest::AllocBytes(size_t bytes) {
  void* p = nullptr;
  const cudaError_t err = cudaMalloc(&p, std::max<size_t>(bytes, 16));
  if (err != cudaSuccess) {
    ADD_FAILURE() << "cudaMalloc(" << bytes << "): " << cudaGetErrorString(err);
    return nullptr;
  }
  allocations_.push_back(p);
  return p;
}

// Copies and fills go through the test's (non-blocking) stream and wait for it: a plain
// cudaMemcpy or cudaMemset on the legacy stream is not ordered with that stream's kernels.
void CudaOpsTest::CopyIn(void* dev, const void* host, size_t bytes) {
  EXPECT_EQ(cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, stream()), cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(stream()), cudaSuccess);
}

void CudaOpsTest::CopyOut(void* host, const void* dev, size_t bytes) {
  EXPECT_EQ(cudaMemcpyAsync(host, dev, bytes, cudaMemcpyDeviceToHost, stream()), cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(stream()), cudaSuccess);
}

void CudaOpsTest::PoisonBytes(void* dev, size_t bytes) {
  EXPECT_EQ(cudaMemsetAsync(dev, 0xff, bytes, stream()), cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(stream()), cudaSuccess);
}

}  // namespace strata::testing_cuda
