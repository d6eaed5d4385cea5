// The model's vocabulary as xgrammar reads it (TokenizerInfo): every token id's string as the
// tokenizer stores it, how such strings map to bytes, and the tokens that end an output.
#ifndef STRATA_COMMON_GRAMMAR_XGRAMMAR_VOCABULARY_H_
#define STRATA_COMMON_GRAMMAR_XGRAMMAR_VOCABULARY_H_

#include <xgrammar/xgrammar.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/grammar/grammar_compiler.h"

namespace strata {

// Token id i's entry: its stored string (xgrammar decodes byte-level and byte-fallback forms
// itself); empty, which xgrammar never allows, for special tokens and unused ids; the
// end-of-sequence tokens by id whatever their string.
std::vector<std::string> GrammarTokenStrings(const Tokenizer& tokenizer, int64_t vocab_size);

// INVALID_ARGUMENT without a tokenizer or an end-of-sequence token, or for a tokenizer.json
// xgrammar cannot read. A tiktoken tokenizer's vocabulary is byte-level.
absl::StatusOr<xgrammar::TokenizerInfo> MakeTokenizerInfo(const GrammarVocabulary& vocabulary);

}  // namespace strata

#endif  // STRATA_COMMON_GRAMMAR_XGRAMMAR_VOCABULARY_H_
