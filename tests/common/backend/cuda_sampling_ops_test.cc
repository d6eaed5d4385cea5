// Arg-max and sampling on the device against the CPU Sampler's definition: exact greedy
// choices, draws only from the allowed set, frequencies that follow the distribution,
// reproducibility per (seed, step), and the host Sampler's very tokens for the same draws.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/cuda/kernels/sampling_kernels.h"
#include "common/engine/sampler.h"
#include "tests/common/backend/cuda_test_util.h"

namespace strata::testing_cuda {
namespace {

// The CPU Sampler's distribution in float64: probs[i] for each token (0 outside the kept
// set). `boundary` is a token whose membership depends on rounding (top-p cut within 1e-4).
struct RefDistribution {
  std::vector<double> probs;
  int boundary = -1;
};

RefDistribution Reference(const std::vector<float>& logits, float temperature, int top_k,
                          float top_p) {
  const int vocab = static_cast<int>(logits.size());
  std::vector<std::pair<float, int>> cand(vocab);
  for (int i = 0; i < vocab; ++i) cand[i] = {logits[i] / temperature, i};
  std::sort(cand.begin(), cand.end(), [](const auto& a, const auto& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  });
  int keep = top_k > 0 && top_k < vocab ? top_k : vocab;
  std::vector<double> e(keep);
  double total = 0.0;
  for (int i = 0; i < keep; ++i) total += (e[i] = std::exp(double{cand[i].first} - cand[0].first));
  RefDistribution ref;
  if (top_p < 1.0f) {
    double mass = 0.0;
    int cut = 0;
    while (cut < keep) {
      mass += e[cut] / total;
      ++cut;
      if (mass >= top_p) break;
    }
    if (std::fabs(mass - top_p) < 1e-4 && cut < keep) ref.boundary = cand[cut].second;
    if (std::fabs(mass - e[cut - 1] / total - top_p) < 1e-4) ref.boundary = cand[cut - 1].second;
    keep = cut;
  }
  ref.probs.assign(vocab, 0.0);
  double kept = 0.0;
  for (int i = 0; i < keep; ++i) kept += e[i];
  for (int i = 0; i < keep; ++i) ref.probs[cand[i].second] = e[i] / kept;
  return ref;
}

class SamplingTest : public CudaOpsTest {
 protected:
  // Samples `rows` copies of `logits` with steps 0..rows-1; after_argmax: as a decode step
  // does, the arg-max first, the draw reading it (keep_greedy_rows).
  std::vector<int32_t> Sample(const std::vector<float>& logits, int rows, gpu::SampleParams p,
                              bool after_argmax = false, bool draw_first = false) {
    const int64_t vocab = static_cast<int64_t>(logits.size());
    std::vector<float> all(rows * vocab);
    std::vector<gpu::SampleParams> params(rows, p);
    for (int r = 0; r < rows; ++r) {
      std::copy(logits.begin(), logits.end(), all.begin() + r * vocab);
      params[r].step = p.step + r;
    }
    const float* d_logits = Put(all);
    const gpu::SampleParams* d_params = Put(params);
    int32_t* d_out = Poisoned<int32_t>(rows);
    uint8_t* d_scratch = Poisoned<uint8_t>(gpu::SampleScratchBytes(rows, vocab));
    uint8_t* d_argmax_scratch = Poisoned<uint8_t>(gpu::ArgmaxScratchBytes(rows, vocab));
    if (HasFailure()) return {};
    if (after_argmax) {
      EXPECT_EQ(gpu::LaunchArgmax(d_logits, rows, vocab, d_argmax_scratch, d_out, stream()),
                cudaSuccess);
    }
    const cudaError_t launched = gpu::LaunchSample(d_logits, rows, vocab, d_params, d_scratch,
                                                   d_out, stream(), after_argmax, draw_first);
    EXPECT_EQ(launched, cudaSuccess) << cudaGetErrorString(launched);
    EXPECT_EQ(cudaGetLastError(), cudaSuccess);
    EXPECT_EQ(cudaStreamSynchronize(stream()), cudaSuccess);
    return Get(d_out, rows);
  }
};

TEST_F(CudaOpsTest, ArgmaxFirstOnTies) {
  for (int64_t vocab : {33, 1000, 151936, 300001}) {
    for (int64_t n : {1, 3, 17}) {
      std::vector<float> logits = RandomFloats(n * vocab, 5.0f);
      std::vector<int32_t> want(n);
      for (int64_t t = 0; t < n; ++t) {
        float* row = &logits[t * vocab];
        if (t % 3 == 1) {  // the maximum twice
          int a = RandomInt(0, vocab - 1), b = RandomInt(0, vocab - 1);
          if (a > b) std::swap(a, b);
          row[a] = row[b] = 6.0f;
        } else if (t % 3 == 2 && n > 3) {
          std::fill(row, row + vocab, -1.0f);  // all equal: token 0
        }
        if (t == 4) row[0] = row[vocab / 2] = std::nanf("");      // NaN never wins (as on the host)
        if (t == 7) std::fill(row, row + vocab, -INFINITY);       // all -inf: token 0
        if (t == 10) std::fill(row, row + vocab, std::nanf(""));  // all NaN: token 0
        // The first largest non-NaN value (strata::ArgMax's definition).
        int64_t best = -1;
        for (int64_t i = 0; i < vocab; ++i) {
          if (!std::isnan(row[i]) && (best < 0 || row[i] > row[best])) best = i;
        }
        want[t] = static_cast<int32_t>(best < 0 ? 0 : best);
      }
      const float* d_logits = Put(logits);
      int32_t* d_out = Poisoned<int32_t>(n);
      uint8_t* d_scratch = Poisoned<uint8_t>(gpu::ArgmaxScratchBytes(n, vocab));
      ASSERT_FALSE(HasFailure());
      LAUNCH_OK(gpu::LaunchArgmax(d_logits, n, vocab, d_scratch, d_out, stream()));
      const std::vector<int32_t> got = Get(d_out, n);
      int64_t mismatches = 0;
      for (int64_t t = 0; t < n; ++t) mismatches += got[t] != want[t];
      RecordResult("argmax (mismatches)", absl::StrCat("n=", n, " vocab=", vocab),
                   static_cast<double>(mismatches), 0.0);
      EXPECT_EQ(got, want);
    }
  }
}

struct SampleCase {
  const char* name;
  int vocab;
  float temperature;
  int top_k;
  float top_p;
  bool ties;  // logits from {0, 1, 2}: the top-k cut falls inside a run of equal logits
};

TEST_F(SamplingTest, FrequenciesFollowTheDistribution) {
  const SampleCase cases[] = {
      {"gumbel", 64, 0.8f, 0, 1.0f, false},    {"top-k", 64, 1.0f, 10, 1.0f, false},
      {"top-p", 64, 0.7f, 0, 0.9f, false},     {"top-k+top-p", 64, 1.2f, 20, 0.8f, false},
      {"top-k ties", 64, 1.0f, 5, 1.0f, true}, {"top-p vocab>1024", 3000, 0.4f, 0, 0.9f, false},
  };
  for (const SampleCase& c : cases) {
    const int rows = c.vocab > 1000 ? 8192 : 16384;
    std::vector<float> logits = RandomFloats(c.vocab, 2.0f);
    if (c.ties) {
      for (float& l : logits) l = static_cast<float>(RandomInt(0, 2));
    }
    const RefDistribution ref = Reference(logits, c.temperature, c.top_k, c.top_p);
    const gpu::SampleParams params{.temperature = c.temperature,
                                   .top_k = c.top_k,
                                   .top_p = c.top_p,
                                   .seed = rng()(),
                                   .step = 1000};
    const std::vector<int32_t> tokens = Sample(logits, rows, params);
    ASSERT_EQ(tokens.size(), static_cast<size_t>(rows));
    std::vector<double> freq(c.vocab, 0.0);
    int64_t outside = 0;
    for (int32_t tok : tokens) {
      if (tok < 0 || tok >= c.vocab) {
        ++outside;
        continue;
      }
      freq[tok] += 1.0 / rows;
      if (ref.probs[tok] == 0.0 && tok != ref.boundary) ++outside;
    }
    // Total variation against its own sampling noise: mean about 0.4 sum sigma_i.
    double tv = 0.0, sigma_sum = 0.0;
    for (int i = 0; i < c.vocab; ++i) {
      tv += 0.5 * std::fabs(freq[i] - ref.probs[i]);
      sigma_sum += 0.5 * std::sqrt(ref.probs[i] * (1.0 - ref.probs[i]) / rows);
    }
    const std::string shape = absl::StrCat(c.name, " vocab=", c.vocab, " T=", c.temperature,
                                           " k=", c.top_k, " p=", c.top_p, " rows=", rows);
    RecordResult("sample outside allowed set", shape, static_cast<double>(outside), 0.0);
    EXPECT_EQ(outside, 0) << shape;
    RecordResult("sample total variation", shape, tv, 2.0 * sigma_sum + 0.005);
    EXPECT_LE(tv, 2.0 * sigma_sum + 0.005) << shape;
  }
}

TEST_F(SamplingTest, GreedyAndReproducible) {
  const int vocab = 151936;
  // A peaked distribution: 300 hot tokens carry almost all the mass.
  std::vector<float> logits = RandomFloats(vocab, 2.0f);
  for (int i = 0; i < 300; ++i) logits[RandomInt(0, vocab - 1)] = 10.0f + RandomFloats(1, 2.0f)[0];
  const int32_t argmax =
      static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  const uint64_t seed = rng()();

  // Temperature 0 and top_k 1 are greedy.
  for (const gpu::SampleParams& p :
       {gpu::SampleParams{.temperature = 0.0f, .seed = seed},
        gpu::SampleParams{.temperature = 1.0f, .top_k = 1, .seed = seed}}) {
    for (int32_t tok : Sample(logits, 4, p)) EXPECT_EQ(tok, argmax);
  }
  for (const gpu::SampleParams& p :
       {gpu::SampleParams{.temperature = 0.9f, .top_k = 50, .top_p = 0.9f, .seed = seed},
        gpu::SampleParams{.temperature = 1.0f, .top_p = 0.95f, .seed = seed},
        gpu::SampleParams{.temperature = 1.0f, .seed = seed}}) {
    const std::vector<int32_t> a = Sample(logits, 8, p);
    const std::vector<int32_t> b = Sample(logits, 8, p);
    EXPECT_EQ(a, b) << "same seed and steps must repeat";
    const RefDistribution ref = Reference(logits, p.temperature, p.top_k, p.top_p);
    int64_t outside = 0;
    for (int32_t tok : a) outside += tok < 0 || tok >= vocab || ref.probs[tok] == 0.0;
    RecordResult(
        "sample large vocab outside set",
        absl::StrCat("vocab=", vocab, " T=", p.temperature, " k=", p.top_k, " p=", p.top_p),
        static_cast<double>(outside), 0.0);
    EXPECT_EQ(outside, 0);
    gpu::SampleParams other = p;
    other.seed = seed + 1;
    const std::vector<int32_t> c = Sample(logits, 8, other);
    EXPECT_NE(a, c) << "another seed should change some of 8 draws";
  }
}

// The device draws what the host's Sampler draws from the same logits at the same step: a
// request's tokens do not depend on which of them picked each one. Only rounding may part them
// (a draw within float error of a boundary between two tokens): at most one in the lot. Both
// ways of finding a wide nucleus (radix passes, or the draw first: STRATA_NUCLEUS).
class DeviceDrawsTest : public SamplingTest, public ::testing::WithParamInterface<bool> {};

TEST_P(DeviceDrawsTest, AreTheHostSamplersDraws) {
  const bool draw_first = GetParam();
  const int steps = 64;
  int64_t mismatches = 0, draws = 0;
  // Normal logits, and over the larger vocabularies 200 tokens lifted a little: several tokens
  // are likely at each temperature (a token far above the rest would take every draw). The
  // last, nearly flat, puts 100k tokens in a top-p nucleus. Rounded logits tie many tokens,
  // so cuts fall among equal logits and are taken by index.
  struct Logits {
    int vocab;
    float spread;
    bool rounded;
  };
  for (auto [vocab, spread, rounded] : {Logits{64, 3.0f, false},
                                        {3000, 3.0f, false},
                                        {151936, 3.0f, false},
                                        {151936, 3.0f, true},
                                        {151936, 0.05f, false}}) {
    std::vector<float> logits = RandomFloats(vocab, spread);
    for (int i = 0; vocab > 1000 && spread > 1.0f && i < 200; ++i) {
      logits[RandomInt(0, vocab - 1)] += 3.0f;
    }
    for (float& x : logits) x = rounded ? std::round(2.0f * x) / 2.0f : x;
    const SamplingParams settings[] = {
        {.temperature = 1.0f, .seed = 21},
        {.temperature = 0.7f, .top_p = 0.9f, .seed = 22},
        {.temperature = 0.9f, .top_k = 40, .seed = 23},
        {.temperature = 0.8f, .top_k = 50, .top_p = 0.8f, .seed = 24},
        {.temperature = 1.0f, .seed = 25, .min_p = 0.1f},
        {.temperature = 0.6f, .top_p = 0.95f, .seed = 26, .min_p = 0.02f},
    };
    for (const SamplingParams& s : settings) {
      const gpu::SampleParams p{.temperature = s.temperature,
                                .top_k = s.top_k,
                                .top_p = s.top_p,
                                .min_p = s.min_p,
                                .seed = s.seed,
                                .step = 0};
      // Steps 0 .. steps - 1; half the settings as a decode step draws, after the arg-max.
      const std::vector<int32_t> device = Sample(logits, steps, p, s.seed % 2 == 0, draw_first);
      ASSERT_EQ(device.size(), static_cast<size_t>(steps));
      Sampler host(s);
      std::set<int32_t> distinct;
      for (int step = 0; step < steps; ++step) {
        const int32_t token = host.Sample(logits.data(), vocab);
        mismatches += token != device[step];
        distinct.insert(token);
        host.Accept(token);
        ++draws;
      }
      EXPECT_GT(distinct.size(), 1u) << "vocab " << vocab << " T " << s.temperature;
    }
  }
  RecordResult("device draws unlike the host's",
               absl::StrCat(draws, " draws", draw_first ? ", nucleus drawn first" : ""),
               static_cast<double>(mismatches), 1.0);
  EXPECT_LE(mismatches, 1);
}

INSTANTIATE_TEST_SUITE_P(NucleusPaths, DeviceDrawsTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "DrawFirst" : "Radix";
                         });

// The device's logit transforms against the host's definitions (logits_transforms.h): a
// request's list as Sampler::device_row makes it, with two tokens taken on the device since
// (in its token history), bias, min_tokens and the three penalties: the very same logits.
TEST_F(SamplingTest, DeviceTransformsAreTheHosts) {
  const int vocab = 151936;
  std::vector<float> logits = RandomFloats(vocab, 4.0f);
  std::vector<int32_t> prompt(500);
  for (int32_t& t : prompt) t = RandomInt(0, vocab - 1);
  const SamplingParams params{.temperature = 1.0f,
                              .seed = 1,
                              .repetition_penalty = 1.3f,
                              .presence_penalty = 0.4f,
                              .frequency_penalty = 0.25f,
                              .logit_bias = {{17, 1.5f}, {prompt[3], -2.0f}, {vocab - 1, 3.0f}},
                              .min_tokens = 50,
                              .stop_token_ids = {11}};
  const std::vector<int> eos = {2, 3};
  Sampler sampler(params, prompt, eos);
  TokenCounts counts;
  counts.AddPrompt(prompt);
  for (int i = 0; i < 40; ++i) {
    const int32_t t = i % 3 == 0 ? prompt[i] : RandomInt(0, vocab - 1);
    sampler.Accept(t);
    counts.AddOutput(t);
  }
  // Two steps in flight: their tokens are on the device only (one seen before, one new).
  const int32_t in_flight[2] = {prompt[0], RandomInt(0, vocab - 1)};
  const std::optional<RowSampling> row = sampler.device_row(/*in_flight=*/2);
  ASSERT_TRUE(row.has_value());
  ASSERT_EQ(row->step, 42u);
  ASSERT_EQ(row->list_step, 40u);
  for (int32_t t : in_flight) counts.AddOutput(t);

  std::vector<gpu::LogitEntry> entries;
  for (const TransformToken& t : *row->tokens) {
    entries.push_back(
        {.token = t.token, .output_count = t.output_count, .bias = t.bias, .flags = t.flags});
  }
  gpu::SampleParams p{.temperature = row->temperature, .seed = row->seed, .step = row->step};
  p.repetition_penalty = row->repetition_penalty;
  p.presence_penalty = row->presence_penalty;
  p.frequency_penalty = row->frequency_penalty;
  p.min_tokens = row->min_tokens;
  p.list_offset = 0;
  p.list_size = static_cast<int32_t>(entries.size());
  p.list_step = row->list_step;
  std::vector<int32_t> history(gpu::kTokenHistory, -7);
  history[40 % gpu::kTokenHistory] = in_flight[0];
  history[41 % gpu::kTokenHistory] = in_flight[1];
  float* d_logits = Put(logits);
  const gpu::SampleParams* d_params = Put(std::vector<gpu::SampleParams>{p});
  const gpu::LogitEntry* d_entries = Put(entries);
  const int32_t* d_history = Put(history);
  ASSERT_FALSE(HasFailure());
  LAUNCH_OK(gpu::LaunchApplyLogitTransforms(d_logits, 1, vocab, d_params, d_entries, d_history,
                                            stream()));
  const std::vector<float> got = Get(d_logits, vocab);

  std::vector<float> want = logits;
  ApplyLogitBias(want.data(), vocab, params.logit_bias);
  SuppressTokens(want.data(), vocab, {2, 3, 11});  // 42 < min_tokens: eos and stop ids
  ApplyRepetitionPenalty(want.data(), vocab, counts.seen(), params.repetition_penalty);
  ApplyFrequencyPresencePenalties(want.data(), vocab, counts.output(), params.frequency_penalty,
                                  params.presence_penalty);
  int64_t differ = 0;
  for (int i = 0; i < vocab; ++i) differ += !(got[i] == want[i]);
  RecordResult("transformed logits unlike the host's", absl::StrCat("vocab=", vocab),
               static_cast<double>(differ), 0.0);
  EXPECT_EQ(differ, 0);
}

}  // namespace
}  // namespace strata::testing_cuda
