#include "services/expert-worker/cold_path_model.h"

#include "gtest/gtest.h"

namespace strata {
namespace {

// Qwen3-30B-A3B's expert: 2048 x 768, bf16.
constexpr int64_t kHidden = 2048;
constexpr int64_t kInter = 768;
constexpr uint64_t kBytes = 3 * kHidden * kInter * 2;

// A CPU that reads weights faster than the link copies them: the regime the tier is for.
ColdPathOptions FastCpu() {
  ColdPathOptions o;
  o.copy_bytes_per_s = 25e9;
  o.cpu_bytes_per_s = 100e9;
  o.cpu_flops = 2e12;
  o.cpu_overhead_s = 30e-6;
  return o;
}

TEST(ColdPathModelTest, ForcedModesOverride) {
  ColdPathOptions o = FastCpu();
  o.mode = ColdPathOptions::kCopy;
  EXPECT_EQ(ChooseColdPath(o, kBytes, 1, kHidden, kInter), ColdPath::kCopy);
  o.mode = ColdPathOptions::kCpu;
  EXPECT_EQ(ChooseColdPath(o, kBytes, 100000, kHidden, kInter), ColdPath::kCpu);
}

TEST(ColdPathModelTest, FewTokensPickTheCpuWhenItIsFastEnough) {
  const ColdPathOptions o = FastCpu();
  for (int64_t tokens : {1, 4, 16}) {
    EXPECT_EQ(ChooseColdPath(o, kBytes, tokens, kHidden, kInter), ColdPath::kCpu) << tokens;
  }
}

TEST(ColdPathModelTest, ManyTokensPickTheCopy) {
  const ColdPathOptions o = FastCpu();
  for (int64_t tokens : {512, 4096}) {
    EXPECT_EQ(ChooseColdPath(o, kBytes, tokens, kHidden, kInter), ColdPath::kCopy) << tokens;
  }
}

TEST(ColdPathModelTest, CrossoverMatchesTheEstimates) {
  const ColdPathOptions o = FastCpu();
  const double copy = CopyPathSeconds(o, kBytes);
  EXPECT_DOUBLE_EQ(copy, kBytes / 25e9);
  // Solve cpu(tokens) = copy for the break-even token count.
  const double per_token = 6.0 * kHidden * kInter / o.cpu_flops;
  const double fixed = o.cpu_overhead_s + kBytes / o.cpu_bytes_per_s;
  const int64_t even = static_cast<int64_t>((copy - fixed) / per_token);
  ASSERT_GT(even, 1);
  EXPECT_EQ(ChooseColdPath(o, kBytes, even, kHidden, kInter), ColdPath::kCpu);
  EXPECT_EQ(ChooseColdPath(o, kBytes, even + 1, kHidden, kInter), ColdPath::kCopy);
}

TEST(ColdPathModelTest, ReuseCreditFavorsTheCopy) {
  ColdPathOptions o = FastCpu();
  ASSERT_EQ(ChooseColdPath(o, kBytes, 4, kHidden, kInter), ColdPath::kCpu);
  o.copy_reuses = 8;
  EXPECT_DOUBLE_EQ(CopyPathSeconds(o, kBytes), kBytes / 25e9 / 9);
  EXPECT_EQ(ChooseColdPath(o, kBytes, 4, kHidden, kInter), ColdPath::kCopy);
}

TEST(ColdPathModelTest, DefaultsCopyOnAFastLink) {
  // The measured CPU backend streams an expert slower than pinned PCIe Gen5 copies it.
  const ColdPathOptions o;
  EXPECT_EQ(o.mode, ColdPathOptions::kAuto);
  EXPECT_EQ(ChooseColdPath(o, kBytes, 1, kHidden, kInter), ColdPath::kCopy);
  // On a 5 GB/s link the CPU wins a decode token, but not sixteen.
  ColdPathOptions slow_link = o;
  slow_link.copy_bytes_per_s = 5e9;
  EXPECT_EQ(ChooseColdPath(slow_link, kBytes, 1, kHidden, kInter), ColdPath::kCpu);
  EXPECT_EQ(ChooseColdPath(slow_link, kBytes, 16, kHidden, kInter), ColdPath::kCopy);
}

// The default figures make one miss a copy (9 MiB at 48.6 GB/s: 0.19 ms, the CPU 0.99 ms), but
// with misses enough the CPU takes some, as both paths run at once.
TEST(ColdPathModelTest, SplitSharesAStepsMissesBetweenThePaths) {
  ColdPathOptions o;
  ColdPathSplit split(o, kBytes, kHidden, kInter);
  split.Start();
  int cpu = 0, copy = 0;
  for (int i = 0; i < 16; ++i) (split.Choose(1) == ColdPath::kCpu ? cpu : copy)++;
  EXPECT_GE(cpu, 1);
  EXPECT_GE(copy, 1);
  // Neither total exceeds the other by more than a miss the other path would have taken (else
  // that miss would have gone there).
  const double copy_s = CopyPathSeconds(o, kBytes);
  const double cpu_s = CpuPathSeconds(o, kBytes, 1, kHidden, kInter);
  EXPECT_LE(split.cpu_seconds(), split.copy_seconds() + copy_s);
  EXPECT_LE(split.copy_seconds(), split.cpu_seconds() + cpu_s);
  // Start resets: a lone miss goes where ChooseColdPath sends it.
  split.Start();
  EXPECT_EQ(split.Choose(1), ColdPath::kCopy);
  EXPECT_EQ(split.copy_seconds(), copy_s);
  EXPECT_EQ(split.cpu_seconds(), 0.0);
}

TEST(ColdPathModelTest, SplitHonoursForcedModes) {
  ColdPathOptions o = FastCpu();
  o.mode = ColdPathOptions::kCopy;
  ColdPathSplit copy(o, kBytes, kHidden, kInter);
  copy.Start();
  for (int i = 0; i < 8; ++i) EXPECT_EQ(copy.Choose(1), ColdPath::kCopy);
  o.mode = ColdPathOptions::kCpu;
  ColdPathSplit cpu(o, kBytes, kHidden, kInter);
  cpu.Start();
  for (int i = 0; i < 8; ++i) EXPECT_EQ(cpu.Choose(1), ColdPath::kCpu);
  // kSplit decides as kAuto does.
  o = FastCpu();
  o.mode = ColdPathOptions::kSplit;
  ColdPathSplit split(o, kBytes, kHidden, kInter);
  split.Start();
  // 0.13 ms on the CPU against 0.38 ms copying: two CPU runs end before one copy would.
  EXPECT_EQ(split.Choose(1), ColdPath::kCpu);
  EXPECT_EQ(split.Choose(1), ColdPath::kCpu);
  EXPECT_EQ(split.Choose(1), ColdPath::kCopy);
}

// The fit recovers the rates timings were made with, and refuses timings it cannot separate.
TEST(ColdPathModelTest, FitCpuRatesRecoversTheRatesOfTwoTimings) {
  const double flop = 6.0 * kHidden * kInter;
  const double bytes_per_s = 40e9, flops = 200e9;
  const double one = kBytes / bytes_per_s + flop / flops;
  const double eight = kBytes / bytes_per_s + 8 * flop / flops;
  ColdPathOptions o;
  ASSERT_TRUE(FitCpuRates(one, eight, 8, kBytes, kHidden, kInter, o));
  EXPECT_NEAR(o.cpu_bytes_per_s, bytes_per_s, bytes_per_s * 1e-9);
  EXPECT_NEAR(o.cpu_flops, flops, flops * 1e-9);
  // Steps of two tokens (a worker's channel sized for them) fit the same rates.
  ColdPathOptions two;
  ASSERT_TRUE(
      FitCpuRates(one, kBytes / bytes_per_s + 2 * flop / flops, 2, kBytes, kHidden, kInter, two));
  EXPECT_NEAR(two.cpu_flops, flops, flops * 1e-9);
  // No spread, one dominated by compute (streaming under a quarter), or a single token:
  // defaults kept.
  const ColdPathOptions defaults;
  ColdPathOptions same = defaults;
  EXPECT_FALSE(FitCpuRates(one, one, 8, kBytes, kHidden, kInter, same));
  EXPECT_FALSE(FitCpuRates(1e-3, 8e-3, 8, kBytes, kHidden, kInter, same));
  EXPECT_FALSE(FitCpuRates(one, eight, 1, kBytes, kHidden, kInter, same));
  EXPECT_EQ(same.cpu_bytes_per_s, defaults.cpu_bytes_per_s);
  EXPECT_EQ(same.cpu_flops, defaults.cpu_flops);
}

}  // namespace
}  // namespace strata
