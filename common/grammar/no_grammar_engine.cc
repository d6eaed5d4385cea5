// GrammarCompiler in a build without xgrammar: every format is refused, saying why.
#include "common/grammar/grammar_compiler.h"

namespace strata {

bool GrammarCompiler::available() { return false; }

absl::StatusOr<std::unique_ptr<GrammarCompiler>> GrammarCompiler::Create(
    const GrammarVocabulary& vocabulary, GrammarCompilerOptions options) {
  return Unavailable(absl::FailedPreconditionError(
      "structured output is not available: this server was built without its grammar engine "
      "(xgrammar; scripts/fetch_xgrammar.sh fetches it before a build)"));
}

}  // namespace strata
