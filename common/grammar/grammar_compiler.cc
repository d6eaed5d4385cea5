#include "common/grammar/grammar_compiler.h"

#include "absl/strings/str_cat.h"

namespace strata {
namespace {

class UnavailableCompiler : public GrammarCompiler {
 public:
  explicit UnavailableCompiler(absl::Status reason)
      : GrammarCompiler(GrammarCompilerOptions{.max_cached_grammars = 0, .compile_threads = 1}),
        reason_(std::move(reason)) {}

 protected:
  absl::StatusOr<std::shared_ptr<const CompiledConstraint>> CompileUncached(
      const ResponseFormat& format) override {
    return reason_;
  }

 private:
  const absl::Status reason_;
};

}  // namespace

std::unique_ptr<GrammarCompiler> GrammarCompiler::Unavailable(absl::Status reason) {
  return std::make_unique<UnavailableCompiler>(std::move(reason));
}

std::string GrammarCacheKey(const ResponseFormat& format) {
  std::string key = absl::StrCat(static_cast<int>(format.type), ":");
  switch (format.type) {
    case ResponseFormat::Type::kText:
    case ResponseFormat::Type::kJsonObject:
      break;
    case ResponseFormat::Type::kJsonSchema:
      key += format.json_schema;
      break;
    case ResponseFormat::Type::kRegex:
      key += format.regex;
      break;
    case ResponseFormat::Type::kStructuralTag:
      key += format.structural_tag;
      break;
    case ResponseFormat::Type::kChoice:
      // Each choice with its length first: no two lists share a key.
      for (const std::string& choice : format.choices)
        absl::StrAppend(&key, choice.size(), ":", choice);
      break;
  }
  return key;
}

absl::StatusOr<std::shared_ptr<const CompiledConstraint>> GrammarCompiler::Compile(
    const ResponseFormat& format) {
  if (!format.constrained()) {
    return absl::InvalidArgumentError("a text response format has no grammar");
  }
  if (format.type == ResponseFormat::Type::kChoice) {
    if (format.choices.empty()) return absl::InvalidArgumentError("the list of choices is empty");
    for (const std::string& choice : format.choices) {
      if (choice.empty()) return absl::InvalidArgumentError("a choice cannot be empty");
    }
  }
  const std::string key = GrammarCacheKey(format);
  if (std::shared_ptr<const CompiledConstraint> cached = cache_.Find(key)) return cached;
  absl::StatusOr<std::shared_ptr<const CompiledConstraint>> compiled = CompileUncached(format);
  if (compiled.ok()) cache_.Insert(key, *compiled);
  return compiled;
}

}  // namespace strata
