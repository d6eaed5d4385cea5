// The BPE model of tokenizer.json: vocabulary, ranked merges, byte fallback, unknown-token
// fusing and ignore_merges, merging exactly as Hugging Face `tokenizers` does (a priority queue
// over ranked pairs), with a per-word cache.
#ifndef STRATA_COMMON_TOKENIZER_BPE_MODEL_H_
#define STRATA_COMMON_TOKENIZER_BPE_MODEL_H_

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "common/tokenizer/json_config.h"
#include "common/tokenizer/model.h"

namespace strata {
namespace tokenizer_internal {

class BpeModel : public Model {
 public:
  // Builds the model from the "model" object of tokenizer.json (which must have type BPE).
  static absl::StatusOr<std::unique_ptr<BpeModel>> FromJson(const Json& json,
                                                            absl::string_view where);

  // Appends the ids of `word` (one pre-token) to `ids`.  Fails only when a character is unknown
  // and the configured unk_token is not in the vocabulary.
  absl::Status Tokenize(absl::string_view word, std::vector<int32_t>* ids) const override;

  std::optional<int32_t> TokenToId(absl::string_view token) const override;
  const std::string* IdToToken(int32_t id) const override;
  // The number of vocabulary entries (tokenizers' get_vocab_size).
  size_t vocab_count() const override { return vocab_.size(); }
  int32_t id_limit() const override { return static_cast<int32_t>(id_to_token_.size()); }

 private:
  struct Merge {
    uint32_t rank;
    int32_t new_id;
  };

  BpeModel() = default;

  // BPE::merge_word + Word::merge_all.
  absl::Status MergeWord(absl::string_view word, std::vector<int32_t>* ids) const;
  static uint64_t PairKey(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }

  absl::flat_hash_map<std::string, int32_t> vocab_;
  std::vector<std::optional<std::string>> id_to_token_;
  absl::flat_hash_map<uint64_t, Merge> merges_;
  std::array<int32_t, 256> byte_ids_;  // <0xNN> tokens, -1 when missing
  std::optional<std::string> unk_token_;
  std::string continuing_subword_prefix_;
  std::string end_of_word_suffix_;
  bool fuse_unk_ = false;
  bool byte_fallback_ = false;
  bool ignore_merges_ = false;

  static constexpr size_t kMaxCachedWordBytes = 256;
  static constexpr size_t kMaxCacheEntries = 1 << 16;
  mutable absl::Mutex cache_mutex_;
  mutable absl::flat_hash_map<std::string, std::vector<int32_t>> cache_
      ABSL_GUARDED_BY(cache_mutex_);
};

}  // namespace tokenizer_internal
}  // namespace strata

#endif  // STRATA_COMMON_TOKENIZER_BPE_MODEL_H_
