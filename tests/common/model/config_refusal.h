// The config tests' check of a malformed config.json: refused as INVALID_ARGUMENT, the message
// naming the file and what is wrong.
#ifndef STRATA_TESTS_COMMON_MODEL_CONFIG_REFUSAL_H_
#define STRATA_TESTS_COMMON_MODEL_CONFIG_REFUSAL_H_

#include <string>

#include "common/model/model_config.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace strata {

// `base` with `patch` merged in (RFC 7386: null removes a key) is refused, naming `expected`.
inline void ExpectRefused(nlohmann::json base, const std::string& patch,
                          const std::string& expected) {
  base.merge_patch(nlohmann::json::parse(patch));
  auto c = ParseModelConfig(base.dump(), "some/config.json");
  ASSERT_FALSE(c.ok()) << patch;
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << patch;
  EXPECT_THAT(std::string(c.status().message()), ::testing::HasSubstr("some/config.json"));
  EXPECT_THAT(std::string(c.status().message()), ::testing::HasSubstr(expected));
}

}  // namespace strata

#endif  // STRATA_TESTS_COMMON_MODEL_CONFIG_REFUSAL_H_
