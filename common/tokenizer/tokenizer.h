// A Hugging Face tokenizer.json loader that encodes and decodes exactly as the Python
// `tokenizers` library does, for BPE tokenizers:
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
class BpeModel;
class Decoder;
class Normalizer;
class PreTokenizer;
struct SpecialTokenFrame;
}  // namespace tokenizer_internal

class Tokenizer {
 public:
  // Loads a tokenizer.json.  Errors: NotFound when the file cannot be read, InvalidArgument
  // (naming the file and the offending value) when it is not valid JSON or uses something that
  // is not supported.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromFile(const std::string& path);
  // Loads tokenizer.json text; `source_name` names it in error messages.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromJson(absl::string_view json_text,
                                                             absl::string_view source_name);

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

 private:
  friend class StreamingDecoder;

  Tokenizer();

  // The token string that decoding uses for `id`, or nullptr when it is skipped or unused.
  const std::string* DecodeToken(int32_t id, bool skip_special_tokens) const;
  // Decode for ids known to be in range.
  std::string DecodeInRange(absl::Span<const int32_t> ids, bool skip_special_tokens) const;
  // Whether the decoded text of `ids` may still change when more ids follow (streaming).
  bool DecodeMayChange(absl::Span<const int32_t> ids, bool skip_special_tokens) const;

  std::string source_name_;
  std::unique_ptr<tokenizer_internal::Normalizer> normalizer_;
  std::unique_ptr<tokenizer_internal::PreTokenizer> pre_tokenizer_;
  std::unique_ptr<tokenizer_internal::BpeModel> model_;
  std::unique_ptr<tokenizer_internal::AddedVocabulary> added_;
  std::unique_ptr<tokenizer_internal::SpecialTokenFrame> frame_;
  std::unique_ptr<tokenizer_internal::Decoder> decoder_;
  size_t max_token_bytes_ = 1;
};

}  // namespace strata

#endif  // STRATA_COMMON_TOKENIZER_TOKENIZER_H_
