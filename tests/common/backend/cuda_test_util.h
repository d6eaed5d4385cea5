// Shared pieces of the CUDA op tests: a fixture that skips without a GPU and owns device
// buffers, bf16 helpers, seeded random inputs that differ per test, relative-error checks, and
// the summary table printed when the run ends.
#ifndef STRATA_TESTS_COMMON_BACKEND_CUDA_TEST_UTIL_H_
#define STRATA_TESTS_COMMON_BACKEND_CUDA_TEST_UTIL_H_

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/cuda/cuda_context.h"
#include "common/cuda/cuda_types.h"
#include "common/model/model_weights.h"
#include "common/tensor/dtype.h"
#include "gtest/gtest.h"

namespace strata::testing_cuda {

// A CUDA call that must succeed.
#define CUDA_ASSERT_OK(expr)                                                                     \
  do {                                                                                           \
    const cudaError_t cuda_err_ = (expr);                                                        \
    ASSERT_EQ(cuda_err_, cudaSuccess)                                                            \
        << #expr << ": " << cudaGetErrorName(cuda_err_) << " " << cudaGetErrorString(cuda_err_); \
  } while (0)

// A kernel launcher: its own result, the runtime's last error, then the stream finishing.
#define LAUNCH_OK(expr)                              \
  do {                                               \
    CUDA_ASSERT_OK(expr);                            \
    CUDA_ASSERT_OK(cudaGetLastError());              \
    CUDA_ASSERT_OK(cudaStreamSynchronize(stream())); \
  } while (0)

#define STATUS_ASSERT_OK(expr)                             \
  do {                                                     \
    const absl::Status status_ = (expr);                   \
    ASSERT_TRUE(status_.ok()) << #expr << ": " << status_; \
  } while (0)

inline uint16_t Bf16(float f) { return FloatToBf16(f); }
inline float F(uint16_t bits) { return Bf16ToFloat(bits); }
std::vector<float> ToFloat(const std::vector<uint16_t>& bits);

// One row of the summary table.
void RecordResult(const std::string& op, const std::string& shape, double error, double tol);

// ||out - ref|| / ||ref|| (float64); infinity when out holds a NaN or infinity.
double RelErr(const std::vector<float>& out, const std::vector<double>& ref);
double RelErr(const std::vector<float>& out, const std::vector<float>& ref);

// Records the row and expects error <= tol and no NaN.
void ExpectClose(const std::string& op, const std::string& shape, const std::vector<float>& out,
                 const std::vector<double>& ref, double tol);
void ExpectClose(const std::string& op, const std::string& shape, const std::vector<float>& out,
                 const std::vector<float>& ref, double tol);

// A [out, in] bf16 WeightMatrix / WeightVector over host bits (row-major unless strided).
WeightMatrix HostMatrix(const std::vector<uint16_t>& bits, int64_t out, int64_t in);
WeightVector HostVector(const std::vector<uint16_t>& bits);

// One expert's random bf16 weights in host memory and FfnWeights views into them.
struct HostExpert {
  std::vector<uint16_t> gate_up, down, gate_up_bias, down_bias;  // storage
  FfnWeights ffn;                                                // views into the storage
};

class CudaOpsTest : public ::testing::Test {
 protected:
  void SetUp() override;
  void TearDown() override;

  cudaStream_t stream() const { return shared_->stream(); }
  gpu::CudaContext& context() { return *shared_; }
  std::mt19937_64& rng() { return rng_; }

  // Uniform values in [-scale, scale], rounded to bf16.
  std::vector<uint16_t> RandomBf16(size_t n, float scale = 1.0f);
  std::vector<float> RandomFloats(size_t n, float scale = 1.0f);
  // A random expert of [inter, hidden] gate/up and [hidden, inter] down, scaled so activations
  // stay O(1). `gpt_oss`: the gpt-oss layout instead, gate_up [hidden, 2 * inter] with gate in
  // the even columns, down [inter, hidden], and interleaved biases.
  void MakeRandomExpert(int64_t hidden, int64_t inter, bool gpt_oss, HostExpert& e);
  int RandomInt(int lo, int hi);  // in [lo, hi]

  // Device copies owned by the test (freed in TearDown). A failed allocation or copy records a
  // test failure and returns null; tests check HasFailure() before launching.
  template <typename T>
  T* Put(const std::vector<T>& host) {
    T* dev = static_cast<T*>(AllocBytes(host.size() * sizeof(T)));
    if (dev != nullptr && !host.empty()) CopyIn(dev, host.data(), host.size() * sizeof(T));
    return dev;
  }
  // Uninitialized device memory poisoned with 0xff bytes (NaN for bf16 and float, -1 for ints).
  template <typename T>
  T* Poisoned(size_t n) {
    T* dev = static_cast<T*>(AllocBytes(n * sizeof(T)));
    if (dev != nullptr) PoisonBytes(dev, n * sizeof(T));
    return dev;
  }
  template <typename T>
  std::vector<T> Get(const T* dev, size_t n) {
    std::vector<T> host(n);
    if (n > 0) CopyOut(host.data(), dev, n * sizeof(T));
    return host;
  }
  std::vector<float> GetBf16(const gpu::bf16* dev, size_t n) {
    return ToFloat(Get(reinterpret_cast<const uint16_t*>(dev), n));
  }
  static gpu::bf16* AsBf16(uint16_t* p) { return reinterpret_cast<gpu::bf16*>(p); }
  static const gpu::bf16* AsBf16(const uint16_t* p) {
    return reinterpret_cast<const gpu::bf16*>(p);
  }

 private:
  void* AllocBytes(size_t bytes);
  void CopyIn(void* dev, const void* host, size_t bytes);
  void CopyOut(void* host, const void* dev, size_t bytes);
  void PoisonBytes(void* dev, size_t bytes);

  gpu::CudaContext* shared_ = nullptr;  // one context for the whole run
  std::mt19937_64 rng_;
  std::vector<void*> allocations_;
};

}  // namespace strata::testing_cuda

#endif  // STRATA_TESTS_COMMON_BACKEND_CUDA_TEST_UTIL_H_
