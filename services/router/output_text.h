// A request's output text as tokens arrive: decoded incrementally, watched for stop strings,
// and held back where it could still turn into the start of one.
#ifndef STRATA_SERVICES_ROUTER_OUTPUT_TEXT_H_
#define STRATA_SERVICES_ROUTER_OUTPUT_TEXT_H_

#include <memory>
#include <string>
#include <vector>

#include "common/tokenizer/streaming_decoder.h"
#include "common/tokenizer/tokenizer.h"

namespace strata {

class OutputText {
 public:
  // Without a tokenizer there is no text and no stop string can match. `include_stop`: the
  // stop string that ends the text stays in it.
  OutputText(const Tokenizer* tokenizer, std::vector<std::string> stop,
             bool skip_special_tokens = true, bool include_stop = false);

  struct Update {
    std::string text;      // text that is final and can be sent
    bool stopped = false;  // a stop string completed; `text` ends just before it
  };
  // `match_stop` false (before min_tokens): no stop string ends the text yet, though one that
  // begins in this token's text may still end it later.
  Update Add(int32_t id, bool match_stop = true);
  // Everything still held back, for a request that ends for another reason.
  std::string Flush();

 private:
  std::unique_ptr<StreamingDecoder> decoder_;
  std::vector<std::string> stop_;
  bool include_stop_ = false;
  std::string pending_;  // decoded but not yet sent
};

}  // namespace strata

#endif  // STRATA_SERVICES_ROUTER_OUTPUT_TEXT_H_
