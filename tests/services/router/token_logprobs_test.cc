// LogprobsAt against a log softmax computed here the plain way (long double, the whole
// vocabulary sorted): the chosen token's value, the alternatives' order (ties by lower id) and
// values.
#include "services/router/token_logprobs.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace strata {
namespace {

std::vector<long double> LogSoftmax(const std::vector<float>& row) {
  long double sum = 0;
  for (float x : row) sum += std::exp(static_cast<long double>(x));
  std::vector<long double> out;
  for (float x : row) out.push_back(static_cast<long double>(x) - std::log(sum));
  return out;
}

// Every id, most likely first, ties by lower id.
std::vector<int32_t> Ranked(const std::vector<float>& row) {
  std::vector<int32_t> ids(row.size());
  std::iota(ids.begin(), ids.end(), 0);
  std::stable_sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return row[a] > row[b]; });
  return ids;
}

void ExpectMatchesReference(const std::vector<float>& row, int32_t target, int top) {
  const TokenLogprobs got = LogprobsAt(row.data(), std::ssize(row), target, top);
  const std::vector<long double> want = LogSoftmax(row);
  const std::vector<int32_t> ranked = Ranked(row);
  EXPECT_NEAR(got.logprob, static_cast<double>(want[target]), 1e-4) << "target " << target;
  ASSERT_EQ(got.top.size(), std::min<size_t>(top, row.size()));
  for (size_t i = 0; i < got.top.size(); ++i) {
    EXPECT_EQ(got.top[i].first, ranked[i]) << "rank " << i;
    EXPECT_NEAR(got.top[i].second, static_cast<double>(want[ranked[i]]), 1e-4) << "rank " << i;
  }
}

TEST(TokenLogprobsTest, RandomRowsMatchTheReference) {
  std::mt19937 rng(5);
  std::normal_distribution<float> logit(0.0f, 4.0f);
  for (const int64_t vocab : {1, 7, 1000, 50000}) {
    std::vector<float> row(vocab);
    for (float& x : row) x = logit(rng);
    for (const int top : {0, 1, 5, 20}) {
      ExpectMatchesReference(row, static_cast<int32_t>(vocab / 2), top);
      ExpectMatchesReference(row, 0, top);
    }
  }
}

TEST(TokenLogprobsTest, TiesGoToTheLowerId) {
  // Equal logits everywhere, in the top and at its edge: the lower ids win, whichever order
  // they come in.
  const std::vector<float> row = {1, 3, 0, 3, 2, 3, 2, 3, 2, 1};
  const TokenLogprobs got = LogprobsAt(row.data(), std::ssize(row), 9, 6);
  std::vector<int32_t> ids;
  for (const auto& [id, logprob] : got.top) ids.push_back(id);
  EXPECT_EQ(ids, (std::vector<int32_t>{1, 3, 5, 7, 4, 6}));
  EXPECT_EQ(got.top[0].second, got.top[3].second);
  EXPECT_EQ(got.top[4].second, got.top[5].second);
  ExpectMatchesReference(row, 9, 6);
  const std::vector<float> flat(100, 0.5f);
  const TokenLogprobs uniform = LogprobsAt(flat.data(), std::ssize(flat), 42, 20);
  for (size_t i = 0; i < uniform.top.size(); ++i) {
    EXPECT_EQ(uniform.top[i].first, static_cast<int32_t>(i));
    EXPECT_NEAR(uniform.top[i].second, -std::log(100.0), 1e-5);
  }
  EXPECT_NEAR(uniform.logprob, -std::log(100.0), 1e-5);
}

TEST(TokenLogprobsTest, MoreAlternativesThanTheVocabularyGiveItAll) {
  const std::vector<float> row = {0.5f, -1.0f, 2.0f};
  const TokenLogprobs got = LogprobsAt(row.data(), std::ssize(row), 1, 20);
  ASSERT_EQ(got.top.size(), 3u);
  EXPECT_EQ(got.top[0].first, 2);
  EXPECT_EQ(got.top[2].first, 1);
  EXPECT_FLOAT_EQ(got.top[2].second, got.logprob);
  ExpectMatchesReference(row, 1, 3);
}

// Large logits lose nothing: the sum is taken after the maximum is subtracted.
TEST(TokenLogprobsTest, LargeLogitsStayFinite) {
  const std::vector<float> row = {30000.0f, 30000.0f, -30000.0f};
  const TokenLogprobs got = LogprobsAt(row.data(), std::ssize(row), 1, 3);
  EXPECT_NEAR(got.logprob, -std::log(2.0), 1e-6);
  EXPECT_NEAR(got.top[0].second, -std::log(2.0), 1e-6);
  EXPECT_EQ(got.top[2].first, 2);
  EXPECT_LT(got.top[2].second, -50000.0f);
  EXPECT_TRUE(std::isfinite(got.top[2].second));
}

}  // namespace
}  // namespace strata
