// A request's response format made into a grammar over the model's vocabulary (xgrammar, the
// engine vLLM and SGLang use): a CompiledConstraint whose TokenConstraint gives each step's
// token mask. Compiled grammars are kept in a bounded cache by format, since clients send the
// same schema again and again. Safe to call from many threads.
//
// Built without xgrammar (scripts/fetch_xgrammar.sh fetches it), every format other than text
// is refused with FAILED_PRECONDITION saying so (no_grammar_engine.cc).
#ifndef STRATA_COMMON_GRAMMAR_GRAMMAR_COMPILER_H_
#define STRATA_COMMON_GRAMMAR_GRAMMAR_COMPILER_H_

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/engine/token_constraint.h"
#include "common/grammar/grammar_cache.h"
#include "common/grammar/response_format.h"
#include "common/tokenizer/tokenizer.h"

namespace strata {

struct GrammarCompilerOptions {
  int max_cached_grammars = 64;  // compiled formats kept, the least recently used dropped
  int compile_threads = 2;       // xgrammar's threads for one grammar's token-mask tables
};

// The vocabulary grammars are compiled against.
struct GrammarVocabulary {
  const Tokenizer* tokenizer = nullptr;  // the token strings; must outlive the compiler
  // The tokenizer.json text: how token strings map to bytes (byte-level BPE, as Qwen's, or
  // SentencePiece byte fallback, as Llama's), read from its decoder and normalizer. Unused
  // for a tiktoken tokenizer (Kimi's), whose token strings are byte-level.
  std::string tokenizer_json;
  std::vector<int> eos_token_ids;  // what ends a complete output
  int64_t vocab_size = 0;          // the model's logit rows (at least the tokenizer's ids)
};

class GrammarCompiler {
 public:
  // Whether this build has the grammar engine.
  static bool available();
  // INVALID_ARGUMENT for a vocabulary without a tokenizer or end-of-sequence token, or one the
  // engine cannot read. Without the engine: a compiler that refuses every format.
  static absl::StatusOr<std::unique_ptr<GrammarCompiler>> Create(
      const GrammarVocabulary& vocabulary, GrammarCompilerOptions options = {});
  // A compiler that refuses every format with `reason` (a model without a tokenizer, a build
  // without the engine).
  static std::unique_ptr<GrammarCompiler> Unavailable(absl::Status reason);
  virtual ~GrammarCompiler() = default;

  // The grammar of `format` (not kText). INVALID_ARGUMENT with the engine's message for a
  // schema or expression it cannot take; FAILED_PRECONDITION without the engine.
  absl::StatusOr<std::shared_ptr<const CompiledConstraint>> Compile(const ResponseFormat& format);

  GrammarCache::Stats cache_stats() const { return cache_.stats(); }

 protected:
  explicit GrammarCompiler(GrammarCompilerOptions options)
      : cache_(static_cast<size_t>(std::max(options.max_cached_grammars, 0))) {}
  // The engine's compile, uncached.
  virtual absl::StatusOr<std::shared_ptr<const CompiledConstraint>> CompileUncached(
      const ResponseFormat& format) = 0;

 private:
  GrammarCache cache_;
};

// The key a format is cached under: its type and text, unambiguous.
std::string GrammarCacheKey(const ResponseFormat& format);

}  // namespace strata

#endif  // STRATA_COMMON_GRAMMAR_GRAMMAR_COMPILER_H_
