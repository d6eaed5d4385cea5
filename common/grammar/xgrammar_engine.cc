// GrammarCompiler on xgrammar: grammars compiled against the model's vocabulary, and a
// GrammarMatcher per request that fills the next token's bitmask.
#include <dlpack/dlpack.h>
#include <xgrammar/xgrammar.h>

#include <exception>
#include <limits>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/grammar/grammar_compiler.h"
#include "common/grammar/xgrammar_vocabulary.h"

namespace strata {
namespace {

constexpr float kMasked = -std::numeric_limits<float>::infinity();

class XgrammarConstraint : public TokenConstraint {
 public:
  XgrammarConstraint(const xgrammar::CompiledGrammar& grammar, int vocab_size)
      : matcher_(grammar),
        vocab_size_(vocab_size),
        bitmask_(static_cast<size_t>(xgrammar::GetBitmaskSize(vocab_size))) {}

  void MaskLogits(float* logits, int64_t vocab) override {
    if (matcher_.IsTerminated()) {  // nothing may follow
      std::fill(logits, logits + vocab, kMasked);
      return;
    }
    int64_t shape[1] = {static_cast<int64_t>(bitmask_.size())};
    DLTensor tensor{};
    tensor.data = bitmask_.data();
    tensor.device = DLDevice{kDLCPU, 0};
    tensor.ndim = 1;
    tensor.dtype = xgrammar::GetBitmaskDLType();
    tensor.shape = shape;
    matcher_.FillNextTokenBitmask(&tensor);
    const int64_t known = std::min<int64_t>(vocab, vocab_size_);
    for (int64_t i = 0; i < known; ++i) {
      if (((bitmask_[i >> 5] >> (i & 31)) & 1) == 0) logits[i] = kMasked;
    }
    std::fill(logits + known, logits + vocab, kMasked);
  }

  bool Accept(int32_t token) override {
    if (token < 0 || token >= vocab_size_ || matcher_.IsTerminated()) return false;
    return matcher_.AcceptToken(token);
  }

  bool terminated() const override { return matcher_.IsTerminated(); }

 private:
  xgrammar::GrammarMatcher matcher_;
  const int vocab_size_;
  std::vector<uint32_t> bitmask_;  // bit i of word i / 32: token i may come next
};

class XgrammarGrammar : public CompiledConstraint {
 public:
  explicit XgrammarGrammar(xgrammar::CompiledGrammar grammar) : grammar_(std::move(grammar)) {}
  std::unique_ptr<TokenConstraint> NewConstraint() const override {
    return std::make_unique<XgrammarConstraint>(grammar_,
                                                grammar_.GetTokenizerInfo().GetVocabSize());
  }

 private:
  xgrammar::CompiledGrammar grammar_;
};

// An EBNF string literal of `text`: quotes and backslashes escaped, control bytes as \uXXXX
// (fixed width: \x would take the hex digits that follow), other UTF-8 as it is.
std::string EbnfLiteral(const std::string& text) {
  std::string out = "\"";
  for (unsigned char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20 || c == 0x7f) {
      absl::StrAppend(&out, "\\u00", absl::Hex(c, absl::kZeroPad2));
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

class XgrammarCompiler : public GrammarCompiler {
 public:
  XgrammarCompiler(const xgrammar::TokenizerInfo& info, GrammarCompilerOptions options)
      : GrammarCompiler(options),
        // Our cache (GrammarCache) keeps whole grammars by format; xgrammar's would too.
        compiler_(info, std::max(options.compile_threads, 1), /*cache_enabled=*/false) {}

 protected:
  absl::StatusOr<std::shared_ptr<const CompiledConstraint>> CompileUncached(
      const ResponseFormat& format) override {
    // No free whitespace between JSON tokens (", " and ": " separators): a model that may put
    // any amount of it there can spend its whole budget on spaces and never close the object.
    constexpr bool kAnyWhitespace = false;
    try {
      std::optional<xgrammar::CompiledGrammar> grammar;
      switch (format.type) {
        case ResponseFormat::Type::kJsonObject:
          // Any object: properties and values unconstrained (strict mode off).
          grammar = compiler_.CompileJSONSchema(R"({"type": "object"})", kAnyWhitespace,
                                                std::nullopt, std::nullopt,
                                                /*strict_mode=*/false);
          break;
        case ResponseFormat::Type::kJsonSchema:
          // Strict mode: no properties or items the schema does not name (vLLM's default).
          grammar = compiler_.CompileJSONSchema(format.json_schema, kAnyWhitespace, std::nullopt,
                                                std::nullopt, /*strict_mode=*/true);
          break;
        case ResponseFormat::Type::kRegex:
          grammar = compiler_.CompileRegex(format.regex);
          break;
        case ResponseFormat::Type::kChoice: {
          std::string ebnf = "root ::= ";
          for (size_t i = 0; i < format.choices.size(); ++i) {
            absl::StrAppend(&ebnf, i == 0 ? "" : " | ", EbnfLiteral(format.choices[i]));
          }
          grammar = compiler_.CompileGrammar(ebnf);
          break;
        }
        case ResponseFormat::Type::kStructuralTag:
          grammar = compiler_.CompileStructuralTag(format.structural_tag);
          break;
        case ResponseFormat::Type::kText:
          return absl::InvalidArgumentError("a text response format has no grammar");
      }
      return std::make_shared<const XgrammarGrammar>(*std::move(grammar));
    } catch (const std::exception& e) {
      return absl::InvalidArgumentError(e.what());
    }
  }

 private:
  xgrammar::GrammarCompiler compiler_;
};

}  // namespace

bool GrammarCompiler::available() { return true; }

absl::StatusOr<std::unique_ptr<GrammarCompiler>> GrammarCompiler::Create(
    const GrammarVocabulary& vocabulary, GrammarCompilerOptions options) {
  absl::StatusOr<xgrammar::TokenizerInfo> info = MakeTokenizerInfo(vocabulary);
  if (!info.ok()) return info.status();
  return std::unique_ptr<GrammarCompiler>(new XgrammarCompiler(*info, options));
}

}  // namespace strata
