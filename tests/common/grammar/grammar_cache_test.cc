#include "common/grammar/grammar_cache.h"

#include <memory>

#include "common/grammar/grammar_compiler.h"
#include "gtest/gtest.h"

namespace strata {
namespace {

class NoConstraint : public CompiledConstraint {
 public:
  std::unique_ptr<TokenConstraint> NewConstraint() const override { return nullptr; }
};

TEST(GrammarCacheTest, KeepsTheMostRecentlyUsed) {
  GrammarCache cache(2);
  auto a = std::make_shared<NoConstraint>(), b = std::make_shared<NoConstraint>(),
       c = std::make_shared<NoConstraint>();
  cache.Insert("a", a);
  cache.Insert("b", b);
  EXPECT_EQ(cache.Find("a"), a);  // a is now the most recent: b goes first
  cache.Insert("c", c);
  EXPECT_EQ(cache.Find("b"), nullptr);
  EXPECT_EQ(cache.Find("a"), a);
  EXPECT_EQ(cache.Find("c"), c);
  const GrammarCache::Stats stats = cache.stats();
  EXPECT_EQ(stats.entries, 2u);
  EXPECT_EQ(stats.hits, 3);
  EXPECT_EQ(stats.misses, 1);
}

TEST(GrammarCacheTest, ASecondInsertKeepsTheFirst) {
  GrammarCache cache(4);
  auto first = std::make_shared<NoConstraint>();
  cache.Insert("k", first);
  cache.Insert("k", std::make_shared<NoConstraint>());
  EXPECT_EQ(cache.Find("k"), first);
}

TEST(GrammarCacheTest, CapacityZeroKeepsNothing) {
  GrammarCache cache(0);
  cache.Insert("k", std::make_shared<NoConstraint>());
  EXPECT_EQ(cache.Find("k"), nullptr);
}

TEST(GrammarCacheKeyTest, ChoiceListsDoNotCollide) {
  const ResponseFormat ab = ResponseFormat::Choice({"a", "b"});
  const ResponseFormat joined = ResponseFormat::Choice({"a1:b"});
  const ResponseFormat regex = ResponseFormat::Regex("a");
  const ResponseFormat schema = ResponseFormat::JsonSchema("a");
  EXPECT_NE(GrammarCacheKey(ab), GrammarCacheKey(joined));
  EXPECT_NE(GrammarCacheKey(regex), GrammarCacheKey(schema));
}

TEST(GrammarCompilerTest, UnavailableRefusesWithItsReason) {
  std::unique_ptr<GrammarCompiler> compiler =
      GrammarCompiler::Unavailable(absl::FailedPreconditionError("no tokenizer here"));
  absl::StatusOr<std::shared_ptr<const CompiledConstraint>> compiled =
      compiler->Compile(ResponseFormat::JsonObject());
  EXPECT_EQ(compiled.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(compiled.status().message(), "no tokenizer here");
}

TEST(GrammarCompilerTest, RefusesEmptyChoices) {
  std::unique_ptr<GrammarCompiler> compiler =
      GrammarCompiler::Unavailable(absl::FailedPreconditionError("unused"));
  EXPECT_EQ(compiler->Compile(ResponseFormat::Choice({})).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(compiler->Compile(ResponseFormat::Choice({"a", ""})).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace strata
