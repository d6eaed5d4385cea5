// Linear layers on the device (GEMV and cuBLASLt paths, bf16 and FP8 weights), the FP8
// quantizer, and the shared expert's gated add, against the CPU reference.
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/backend/cpu/cpu_kernels.h"
#include "common/backend/cuda/cuda_weights.h"
#include "common/backend/cuda/linear.h"
#include "common/cuda/kernels/elementwise_kernels.h"
#include "common/cuda/kernels/fp8_quant.h"
#include "common/cuda/kernels/gemv_kernels.h"
#include "common/util/thread_pool.h"
#include "tests/common/backend/cuda_test_util.h"

namespace strata::testing_cuda {
namespace {

ThreadPool& Pool() {
  static ThreadPool* pool = new ThreadPool();
  return *pool;
}

// Float32 view of FP8 bytes times their row scales: what the FP8 kernels should compute with.
std::vector<float> DequantizeHost(const std::vector<uint8_t>& q, const std::vector<float>& scale,
                                  int64_t out, int64_t in) {
  std::vector<float> w(out * in);
  for (int64_t o = 0; o < out; ++o) {
    for (int64_t i = 0; i < in; ++i) {
      const __half_raw h = __nv_cvt_fp8_to_halfraw(q[o * in + i], __NV_E4M3);
      w[o * in + i] = __half2float(__half(h)) * scale[o];
    }
  }
  return w;
}

TEST_F(CudaOpsTest, QuantizeFp8HostAndDeviceAgree) {
  for (auto [out, in] : {std::pair<int64_t, int64_t>{37, 100}, {768, 2048}}) {
    std::vector<uint16_t> w = RandomBf16(out * in, 0.5f);
    for (int64_t i = 0; i < 2 * in; ++i) w[3 * in + i] = Bf16(0.0f);  // rows 3 and 4 zero,
    w[4 * in + 7] = Bf16(1e-8f);  // then row 4 gets a tiny absmax
    std::vector<uint8_t> q_host(out * in);
    std::vector<float> s_host(out);
    QuantizeBf16RowsToFp8E4M3(w.data(), out, in, q_host.data(), s_host.data());
    const uint16_t* d_w = Put(w);
    uint8_t* d_q = Poisoned<uint8_t>(out * in);
    float* d_s = Poisoned<float>(out);
    ASSERT_FALSE(HasFailure());
    LAUNCH_OK(gpu::LaunchQuantizeFp8PerChannel(AsBf16(d_w), out, in, d_q, d_s, stream()));
    const std::vector<uint8_t> q_dev = Get(d_q, out * in);
    const std::vector<float> s_dev = Get(d_s, out);
    int64_t mismatches = 0;
    for (int64_t i = 0; i < out * in; ++i) mismatches += q_dev[i] != q_host[i];
    for (int64_t o = 0; o < out; ++o) mismatches += s_dev[o] != s_host[o];
    RecordResult("fp8 quantize dev vs host", absl::StrCat("out=", out, " in=", in, " mismatches"),
                 static_cast<double>(mismatches), 0.0);
    EXPECT_EQ(mismatches, 0);
    // Round trip: within E4M3's 3 mantissa bits of the input.
    const std::vector<float> back = DequantizeHost(q_host, s_host, out, in);
    ExpectClose("fp8 quantize round trip", absl::StrCat("out=", out, " in=", in), back, ToFloat(w),
                4e-2);
  }
}

// An FP8 checkpoint's attention matrices: row-major codes and row scales go to the device as
// they are; any other layout is quantized again from its values. The codes here stay at or
// under 240 in magnitude, so quantizing again (to a row maximum of 448) would change every row.
TEST_F(CudaOpsTest, WeightStoreTakesFp8CheckpointMatricesAsTheyAre) {
  const int64_t out = 48, in = 160;
  std::vector<uint8_t> codes(out * in);
  std::vector<float> scales(out);
  for (int64_t o = 0; o < out; ++o) {
    scales[o] = 0.01f * static_cast<float>(o + 1);
    for (int64_t i = 0; i < in; ++i) {
      const float v = RandomFloats(1, 240.0f)[0];
      codes[o * in + i] = __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3);
    }
  }
  const WeightMatrix row_major{.data = codes.data(),
                               .dtype = DType::kF8E4M3,
                               .out = out,
                               .in = in,
                               .out_stride = in,
                               .in_stride = 1,
                               .scale = scales.data()};
  gpu::DeviceWeightStore store(stream());
  const absl::StatusOr<gpu::DeviceWeight> as_is =
      store.Matrix(row_major, {}, gpu::WeightFormat::kFp8E4M3);
  STATUS_ASSERT_OK(as_is.status());
  EXPECT_EQ(as_is->format, gpu::WeightFormat::kFp8E4M3);
  EXPECT_EQ(Get(static_cast<const uint8_t*>(as_is->data), out * in), codes);
  EXPECT_EQ(Get(as_is->scale, out), scales);

  // The same values seen column by column: repacked and quantized again, within E4M3 rounding.
  std::vector<uint8_t> transposed(out * in);
  for (int64_t o = 0; o < out; ++o) {
    for (int64_t i = 0; i < in; ++i) transposed[i * out + o] = codes[o * in + i];
  }
  WeightMatrix strided = row_major;
  strided.data = transposed.data();
  strided.out_stride = 1;
  strided.in_stride = out;
  const absl::StatusOr<gpu::DeviceWeight> again =
      store.Matrix(strided, {}, gpu::WeightFormat::kFp8E4M3);
  STATUS_ASSERT_OK(again.status());
  const std::vector<float> want = DequantizeHost(codes, scales, out, in);
  const std::vector<float> got = DequantizeHost(
      Get(static_cast<const uint8_t*>(again->data), out * in), Get(again->scale, out), out, in);
  ExpectClose("fp8 matrix quantized again", absl::StrCat("out=", out, " in=", in), got, want, 4e-2);
  EXPECT_NE(Get(static_cast<const uint8_t*>(again->data), out * in), codes);
}

struct LinearCase {
  int64_t n, out, in;
  bool bias;
  gpu::OutType out_type;
};

// A host float32 [out, in] matrix as a weight.
WeightMatrix F32Matrix(const std::vector<float>& m, int64_t out, int64_t in) {
  return WeightMatrix{.data = m.data(),
                      .dtype = DType::kF32,
                      .out = out,
                      .in = in,
                      .out_stride = in,
                      .in_stride = 1};
}

std::string ShapeName(const LinearCase& c) {
  return absl::StrCat("n=", c.n, " out=", c.out, " in=", c.in, c.bias ? " bias" : "",
                      c.out_type == gpu::OutType::kF32 ? " f32" : " bf16");
}

TEST_F(CudaOpsTest, Linear) {
  const LinearCase cases[] = {
      {1, 768, 2048, false, gpu::OutType::kBf16},  // GEMV
      {3, 17, 64, true, gpu::OutType::kF32},
      {16, 2048, 768, true, gpu::OutType::kBf16},
      {1, 1000, 100, true, gpu::OutType::kF32},     // scalar path (in not a vector multiple)
      {5, 64, 72, false, gpu::OutType::kBf16},      // bf16 vector, FP8 scalar
      {17, 768, 2048, false, gpu::OutType::kBf16},  // cuBLASLt
      {64, 2048, 768, true, gpu::OutType::kF32},
      {300, 512, 256, true, gpu::OutType::kBf16},
      {33, 100, 100, false, gpu::OutType::kF32},
      // Tensor-core GEMV: the MoE gate's shape (k split over warps, FP8 in 128-byte pieces),
      // two tokens of a q projection, eight of an o projection with its k split.
      {8, 128, 2048, false, gpu::OutType::kF32},
      {2, 4096, 2048, true, gpu::OutType::kBf16},
      {8, 2048, 4096, false, gpu::OutType::kBf16},
  };
  gpu::LinearRunner runner(&context());
  for (const LinearCase& c : cases) {
    const float w_scale = 2.0f / std::sqrt(static_cast<float>(c.in));
    const std::vector<uint16_t> w = RandomBf16(c.out * c.in, w_scale);
    const std::vector<uint16_t> x = RandomBf16(c.n * c.in, 1.0f);
    const std::vector<uint16_t> bias = RandomBf16(c.out, 0.5f);
    std::vector<uint8_t> q(c.out * c.in);
    std::vector<float> scales(c.out);
    QuantizeBf16RowsToFp8E4M3(w.data(), c.out, c.in, q.data(), scales.data());
    const std::vector<float> w_deq = DequantizeHost(q, scales, c.out, c.in);

    const std::vector<float> xf = ToFloat(x);
    const WeightVector bias_view = c.bias ? HostVector(bias) : WeightVector{};
    std::vector<float> ref(c.n * c.out), ref_fp8(c.n * c.out);
    cpu::Linear(Pool(), xf.data(), c.n, HostMatrix(w, c.out, c.in), bias_view, ref.data());
    cpu::Linear(Pool(), xf.data(), c.n, F32Matrix(w_deq, c.out, c.in), bias_view, ref_fp8.data());

    const uint16_t* d_w = Put(w);
    const uint8_t* d_q = Put(q);
    const float* d_scales = Put(scales);
    const uint16_t* d_x = Put(x);
    const uint16_t* d_bias = Put(bias);
    ASSERT_FALSE(HasFailure());
    const bool f32 = c.out_type == gpu::OutType::kF32;
    const std::string shape = ShapeName(c);
    for (bool fp8 : {false, true}) {
      const gpu::DeviceWeight weight{
          .data = fp8 ? static_cast<const void*>(d_q) : d_w,
          .format = fp8 ? gpu::WeightFormat::kFp8E4M3 : gpu::WeightFormat::kBf16,
          .out = c.out,
          .in = c.in,
          .scale = fp8 ? d_scales : nullptr,
          .bias = c.bias ? AsBf16(d_bias) : nullptr};
      const std::string path = runner.GemvTakes(weight, c.n) ? "gemv" : "cublaslt";
      void* d_y = f32 ? static_cast<void*>(Poisoned<float>(c.n * c.out))
                      : static_cast<void*>(Poisoned<uint16_t>(c.n * c.out));
      ASSERT_FALSE(HasFailure());
      STATUS_ASSERT_OK(runner.Run(weight, AsBf16(d_x), c.n, d_y, c.out_type));
      CUDA_ASSERT_OK(cudaGetLastError());
      CUDA_ASSERT_OK(cudaStreamSynchronize(stream()));
      const std::vector<float> y = f32 ? Get(static_cast<float*>(d_y), c.n * c.out)
                                       : GetBf16(static_cast<gpu::bf16*>(d_y), c.n * c.out);
      if (fp8) {
        ExpectClose(path + " fp8", shape, y, ref_fp8, 1e-2);
        // E4M3 keeps 3 mantissa bits: about 2.6% rms error per weight, so random weights land
        // near 2.6e-2 from the bf16 result whatever the kernel does.
        ExpectClose(path + " fp8 vs bf16 weights", shape, y, ref, 4e-2);
      } else {
        ExpectClose(path + " bf16", shape, y, ref, 1e-2);
      }
    }
  }
}

// FP8 weights times FP8 tokens on the tensor cores (cuBLASLt, a scale per weight row and per
// token): against the host product of the same dequantized operands, and through the runner
// (tokens quantized on the device) against bf16 tokens times the dequantized weights.
TEST_F(CudaOpsTest, Fp8TensorCoreLinear) {
  const LinearCase cases[] = {
      {65, 2048, 768, false, gpu::OutType::kBf16},
      {300, 512, 256, true, gpu::OutType::kBf16},
      {128, 4096, 2048, false, gpu::OutType::kF32},
      {1024, 768, 2048, true, gpu::OutType::kBf16},
  };
  gpu::CublasLtGemm gemm(&context());
  gpu::LinearRunner runner(&context(), {.fp8_tensor_cores = true});
  for (const LinearCase& c : cases) {
    const std::vector<uint16_t> w = RandomBf16(c.out * c.in, 2.0f / std::sqrt(float(c.in)));
    const std::vector<uint16_t> x = RandomBf16(c.n * c.in, 1.0f);
    const std::vector<uint16_t> bias = RandomBf16(c.out, 0.5f);
    std::vector<uint8_t> wq(c.out * c.in), xq(c.n * c.in);
    std::vector<float> w_scales(c.out), x_scales(c.n);
    QuantizeBf16RowsToFp8E4M3(w.data(), c.out, c.in, wq.data(), w_scales.data());
    QuantizeBf16RowsToFp8E4M3(x.data(), c.n, c.in, xq.data(), x_scales.data());
    const std::vector<float> w_deq = DequantizeHost(wq, w_scales, c.out, c.in);
    const std::vector<float> x_deq = DequantizeHost(xq, x_scales, c.n, c.in);
    const WeightMatrix w_view = F32Matrix(w_deq, c.out, c.in);
    const WeightVector bias_view = c.bias ? HostVector(bias) : WeightVector{};
    std::vector<float> both_fp8(c.n * c.out), tokens_bf16(c.n * c.out);
    cpu::Linear(Pool(), x_deq.data(), c.n, w_view, {}, both_fp8.data());
    cpu::Linear(Pool(), ToFloat(x).data(), c.n, w_view, bias_view, tokens_bf16.data());

    const uint8_t* d_wq = Put(wq);
    const uint8_t* d_xq = Put(xq);
    const float* d_ws = Put(w_scales);
    const float* d_xs = Put(x_scales);
    const uint16_t* d_x = Put(x);
    const uint16_t* d_bias = Put(bias);
    ASSERT_FALSE(HasFailure());
    const bool f32 = c.out_type == gpu::OutType::kF32;
    const std::string shape = ShapeName(c);
    auto output = [&]() -> void* {
      return f32 ? static_cast<void*>(Poisoned<float>(c.n * c.out))
                 : static_cast<void*>(Poisoned<uint16_t>(c.n * c.out));
    };
    auto read = [&](void* d_y) {
      return f32 ? Get(static_cast<float*>(d_y), c.n * c.out)
                 : GetBf16(static_cast<gpu::bf16*>(d_y), c.n * c.out);
    };
    void* d_y = output();
    ASSERT_FALSE(HasFailure());
    STATUS_ASSERT_OK(
        gemm.RunFp8(d_wq, d_ws, c.out, c.in, d_xq, d_xs, c.n, d_y, c.out_type, stream()));
    CUDA_ASSERT_OK(cudaStreamSynchronize(stream()));
    ExpectClose("cublaslt fp8 x fp8", shape, read(d_y), both_fp8, 1e-2);

    const gpu::DeviceWeight weight{.data = d_wq,
                                   .format = gpu::WeightFormat::kFp8E4M3,
                                   .out = c.out,
                                   .in = c.in,
                                   .scale = d_ws,
                                   .bias = c.bias ? AsBf16(d_bias) : nullptr};
    d_y = output();
    ASSERT_FALSE(HasFailure());
    STATUS_ASSERT_OK(runner.Run(weight, AsBf16(d_x), c.n, d_y, c.out_type));
    CUDA_ASSERT_OK(cudaStreamSynchronize(stream()));
    // The tokens' own E4M3 rounding: about 2.6% rms per element, as the weights'.
    ExpectClose("linear fp8 tensor cores vs bf16 tokens", shape, read(d_y), tokens_bf16, 4e-2);
  }
}

// LaunchGemv directly past its 16-token launch size, with strided input and output rows.
TEST_F(CudaOpsTest, GemvStridedManyTokens) {
  const int64_t n = 20, out = 96, in = 256, x_stride = 320, y_stride = 100;
  const std::vector<uint16_t> w = RandomBf16(out * in, 0.1f);
  const std::vector<uint16_t> x = RandomBf16(n * x_stride, 1.0f);
  std::vector<float> xf(n * in), ref(n * out);
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t i = 0; i < in; ++i) xf[t * in + i] = F(x[t * x_stride + i]);
  }
  cpu::Linear(Pool(), xf.data(), n, HostMatrix(w, out, in), WeightVector{}, ref.data());
  const uint16_t* d_w = Put(w);
  const uint16_t* d_x = Put(x);
  float* d_y = Poisoned<float>(n * y_stride);
  ASSERT_FALSE(HasFailure());
  const gpu::DeviceWeight weight{.data = d_w, .out = out, .in = in};
  LAUNCH_OK(gpu::LaunchGemv(weight, AsBf16(d_x), x_stride, n, d_y, gpu::OutType::kF32, y_stride,
                            stream()));
  const std::vector<float> y_all = Get(d_y, n * y_stride);
  std::vector<float> y(n * out);
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t o = 0; o < out; ++o) y[t * out + o] = y_all[t * y_stride + o];
  }
  ExpectClose("gemv strided", "n=20 out=96 in=256", y, ref, 1e-2);
}

TEST_F(CudaOpsTest, SharedExpertGateAdd) {
  for (int64_t hidden : {64, 2048}) {
    for (int64_t n : {1, 3, 17}) {
      const std::vector<uint16_t> x = RandomBf16(n * hidden, 1.0f);
      const std::vector<uint16_t> gate = RandomBf16(hidden, 3.0f / std::sqrt(float(hidden)));
      const std::vector<uint16_t> shared = RandomBf16(n * hidden, 1.0f);
      const std::vector<uint16_t> out = RandomBf16(n * hidden, 1.0f);
      std::vector<double> ref(n * hidden);
      for (int64_t t = 0; t < n; ++t) {
        double dot = 0.0;
        for (int64_t i = 0; i < hidden; ++i) dot += double{F(x[t * hidden + i])} * F(gate[i]);
        const double g = 1.0 / (1.0 + std::exp(-dot));
        for (int64_t i = 0; i < hidden; ++i) {
          ref[t * hidden + i] = F(out[t * hidden + i]) + g * F(shared[t * hidden + i]);
        }
      }
      const uint16_t* d_x = Put(x);
      const uint16_t* d_gate = Put(gate);
      const uint16_t* d_shared = Put(shared);
      uint16_t* d_out = Put(out);
      ASSERT_FALSE(HasFailure());
      LAUNCH_OK(gpu::LaunchSharedExpertGateAdd(AsBf16(d_x), AsBf16(d_gate), AsBf16(d_shared), n,
                                               hidden, AsBf16(d_out), stream()));
      ExpectClose("shared expert gate add", absl::StrCat("n=", n, " hidden=", hidden),
                  GetBf16(AsBf16(d_out), n * hidden), ref, 1e-2);
    }
  }
}

}  // namespace
}  // namespace strata::testing_cuda
