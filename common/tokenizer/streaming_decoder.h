// Incremental detokenization for streaming generated tokens.
#ifndef STRATA_COMMON_TOKENIZER_STREAMING_DECODER_H_
#define STRATA_COMMON_TOKENIZER_STREAMING_DECODER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "common/tokenizer/tokenizer.h"

namespace strata {

// Turns ids into text as they arrive.  Each Add returns only text that no later id can change:
// a multi-byte character split over byte tokens is held back until it is complete (and, with a
// ByteFallback decoder, until the run of <0xNN> tokens ends).  The concatenation of everything
// that Add and Flush return equals tokenizer.Decode(all ids, skip_special_tokens).
//
// Ids outside [0, tokenizer.vocab_size()) are ignored.  The Tokenizer must outlive this object.
// Not thread-safe (one stream per object).
class StreamingDecoder {
 public:
  explicit StreamingDecoder(const Tokenizer& tokenizer, bool skip_special_tokens = false);

  // Adds one id; returns the text that became final (often empty).
  std::string Add(int32_t id);
  // Ends the stream: returns whatever is still held back (an unfinished character decodes as
  // U+FFFD, as in Decode) and starts a new stream.
  std::string Flush();

 private:
  const Tokenizer& tokenizer_;
  bool skip_special_tokens_;
  // ids_[0, read_) were emitted already and serve as context: decoding them again together
  // with the new ids and removing `prefix_text_` (their text alone) gives the new text.
  std::vector<int32_t> ids_;
  size_t read_ = 0;
  std::string prefix_text_;
};

}  // namespace strata

#endif  // STRATA_COMMON_TOKENIZER_STREAMING_DECODER_H_
