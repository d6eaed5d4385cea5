// A Hugging Face tokenizer loader that encodes and decodes exactly as the model's own Python
// tokenizer does.  From tokenizer.json, as the `tokenizers` library does, for BPE tokenizers:
//   - byte-level BPE (GPT-2, Qwen2/Qwen3, gpt-oss): ByteLevel pre-tokenizer or Split(regex) +
//     ByteLevel, NFC normalizer, ignore_merges, ByteLevel decoder;
//   - SentencePiece-style BPE (Llama, Mixtral): Prepend/Replace normalizers or the Metaspace
//     pre-tokenizer, byte_fallback, fuse_unk, Replace/ByteFallback/Fuse/Strip or Metaspace
//     decoders;
//   - added tokens (special or not, with single_word/lstrip/rstrip/normalized) and the special
//     tokens a post-processor puts around a text.
// Unsupported components (other models such as Unigram or WordPiece, and a few rarely used
// normalizers, pre-tokenizers and decoders) are rejected when loading, naming the file and the
// component.  Truncation and padding settings are ignored.
// From tiktoken.model and tokenizer_config.json (Kimi-K2, which has no tokenizer.json), as
// Kimi's tokenization_kimi.py does with tiktoken: see FromTiktoken.
//
// A Tokenizer is immutable after loading and safe to use from many threads.
#ifndef STRATA_COMMON_TOKENIZER_TOKENIZER_H_
#define STRATA_COMMON_TOKENIZER_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace strata {

namespace tokenizer_internal {
class AddedVocabulary;
class Decoder;
class Model;
class Normalizer;
class PreTokenizer;
struct SpecialTokenFrame;
class TiktokenModel;
}  // namespace tokenizer_internal

class Tokenizer {
 public:
  // Where a tokenizer was loaded from: what its token strings are (byte-level characters for a
  // tiktoken model, as its Hugging Face tokenizer spells them).
  enum class Format { kTokenizerJson, kTiktoken };

  // The tokenizer of a Hugging Face model directory: `dir`/tokenizer.json when it exists, else
  // `dir`/tiktoken.model with `dir`/tokenizer_config.json (FromTiktoken).  NotFound, naming
  // both files, only when the directory has neither (a model without a tokenizer); a file
  // that exists but cannot be read is FailedPrecondition, a bad one InvalidArgument.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromModelDir(const std::string& dir);
  // FromModelDir for a model that may have no tokenizer: null then, the other errors as they are.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromModelDirIfAny(const std::string& dir);

  // Loads a tokenizer.json.  Errors: NotFound when the file cannot be read, InvalidArgument
  // (naming the file and the offending value) when it is not valid JSON or uses something that
  // is not supported.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromFile(const std::string& path);
  // Loads tokenizer.json text; `source_name` names it in error messages.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromJson(absl::string_view json_text,
                                                             absl::string_view source_name);

  // A tiktoken tokenizer as Kimi's tokenization_kimi.py builds it: `model_text` is a
  // tiktoken.model (ids are ranks, which must be 0..N-1); `config_text` a tokenizer_config.json
  // whose added_tokens_decoder names the special tokens among the 256 ids after the ranks (the
  // others are "<|reserved_token_{id}|>"; entries outside those ids are ignored, as Kimi does).
  // Text is encoded as tokenization_kimi.py's encode(text): cut into pieces (400,000
  // characters, runs of 25,000), special tokens matched anywhere, Kimi's pattern, tiktoken's
  // BPE; add_special_tokens adds nothing.  Decoding joins the tokens' bytes (special tokens as
  // their text) and replaces invalid UTF-8 with U+FFFD; skip_special_tokens leaves out the
  // special tokens marked "special" (reserved ones are).  The names are for error messages.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromTiktoken(absl::string_view model_text,
                                                                 absl::string_view config_text,
                                                                 absl::string_view model_name,
                                                                 absl::string_view config_name);

  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // The ids of `text` (UTF-8; InvalidArgument when it is not), as tokenizers'
  // `encode(text, add_special_tokens=...).ids`: with `add_special_tokens`, the post-processor's
  // special tokens (e.g. Llama's <s>) are added around the text.
  absl::StatusOr<std::vector<int32_t>> Encode(absl::string_view text,
                                              bool add_special_tokens = false) const;

  // The text of `ids`, as tokenizers' `decode(ids, skip_special_tokens=...)`.  Ids outside
  // [0, vocab_size()) are an InvalidArgument error; ids inside it that name no token are
  // skipped, as tokenizers does.
  absl::StatusOr<std::string> Decode(absl::Span<const int32_t> ids,
                                     bool skip_special_tokens = false) const;

  // One more than the largest token id (model vocabulary and added tokens): the size of an
  // embedding table for this tokenizer.
  int32_t vocab_size() const;
  // The id of a token string (added tokens first, then the model's vocabulary).
  std::optional<int32_t> TokenId(absl::string_view token) const;
  // The token string of an id, if the id is used.
  std::optional<std::string> IdToToken(int32_t id) const;
  // Whether `id` is an added token marked special (skipped by skip_special_tokens).
  bool IsSpecial(int32_t id) const;
  // A lower bound on the tokens of a text of `text_bytes` bytes, without encoding it: a token
  // stands for at most max_token_bytes() bytes of normalized text, and normalization shrinks
  // a text at most kMaxNormalizationShrink-fold (NFC composes at most three code points, of
  // no fewer bytes, into one). What refuses a text far over a context before paying for it.
  int64_t MinTokens(size_t text_bytes) const;
  // The longest token string (UTF-8 bytes) of the vocabulary and the added tokens.
  size_t max_token_bytes() const { return max_token_bytes_; }
  static constexpr int kMaxNormalizationShrink = 4;

  // The name given when loading (the file path for FromFile).
  const std::string& source_name() const { return source_name_; }
  Format format() const {
    return tiktoken_ != nullptr ? Format::kTiktoken : Format::kTokenizerJson;
  }

 private:
  friend class StreamingDecoder;

  Tokenizer();

  // The token string that decoding uses for `id`, or nullptr when it is skipped or unused.
  const std::string* DecodeToken(int32_t id, bool skip_special_tokens) const;
  // Encode of one piece of text (all of it, but for a tiktoken tokenizer's long texts).
  absl::Status EncodePiece(absl::string_view text, std::vector<int32_t>* ids) const;
  // Decode for ids known to be in range.
  std::string DecodeInRange(absl::Span<const int32_t> ids, bool skip_special_tokens) const;
  // Whether the decoded text of `ids` may still change when more ids follow (streaming).
  bool DecodeMayChange(absl::Span<const int32_t> ids, bool skip_special_tokens) const;

  std::string source_name_;
  std::unique_ptr<tokenizer_internal::Normalizer> normalizer_;
  std::unique_ptr<tokenizer_internal::PreTokenizer> pre_tokenizer_;
  std::unique_ptr<tokenizer_internal::Model> model_;
  // model_ when it is a tiktoken model (decoded from raw bytes; long texts encoded in pieces).
  const tokenizer_internal::TiktokenModel* tiktoken_ = nullptr;
  std::unique_ptr<tokenizer_internal::AddedVocabulary> added_;
  std::unique_ptr<tokenizer_internal::SpecialTokenFrame> frame_;
  std::unique_ptr<tokenizer_internal::Decoder> decoder_;
  size_t max_token_bytes_ = 1;
};

}  // namespace strata

#endif  // STRATA_COMMON_TOKENIZER_TOKENIZER_H_
