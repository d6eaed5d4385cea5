// One choice of an OpenAI answer, built as its sample's output comes: its text (through the
// tool-call parser when tools are offered), its log-probabilities and its finish, written as
// stream chunks' choices or as the whole choice.
#ifndef STRATA_SERVICES_ROUTER_HTTP_OPENAI_CHOICE_H_
#define STRATA_SERVICES_ROUTER_HTTP_OPENAI_CHOICE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "services/router/http/openai_logprobs.h"
#include "services/router/http/openai_request.h"
#include "services/router/http/openai_tool_calls.h"
#include "services/router/request.h"

namespace strata {

class OpenAiChoice {
 public:
  // `tool_calls`: the reply's parser when tools are offered (chat), else null. `token_text`:
  // a token id's text.
  OpenAiChoice(int index, const OpenAiRequest& request,
               std::function<std::string(int32_t)> token_text,
               std::unique_ptr<ChatToolCalls> tool_calls);

  // The stream choices to send for each event, in order ({"index", "delta" or "text",
  // "logprobs", "finish_reason"}); empty for a whole answer.
  // A stream's first choice: chat's role.
  std::vector<Json> Start();
  // The prompt's text as echoed, with its tokens' log-probabilities (`scores`: of tokens 1..;
  // null for an echo without logprobs).
  std::vector<Json> Echo(const std::string& text, const std::vector<int32_t>& prompt,
                         const std::vector<TokenLogprobs>* scores);
  // New tokens and their text (logprobs: one per id when asked for).
  std::vector<Json> Add(const std::vector<int32_t>& ids, const std::string& text,
                        const std::vector<TokenLogprobs>& logprobs);
  // The sample ended (kLength, kStop or kEos): what the parser held back, and the finish.
  std::vector<Json> Finish(FinishReason reason);

  // The whole choice, once finished.
  Json Whole();

 private:
  std::vector<Json> Text(const std::string& piece);
  Json StreamChoice(Json content);

  const int index_;
  const bool chat_;
  const bool stream_;
  const bool logprobs_;
  std::function<std::string(int32_t)> token_text_;
  OpenAiLogprobs logprob_list_;
  std::unique_ptr<ChatToolCalls> tool_calls_;
  std::string text_;
  std::string finish_;
};

// OpenAI's finish_reason of a sample that ended normally: "length" or "stop".
const char* FinishName(FinishReason reason);

}  // namespace strata

#endif  // STRATA_SERVICES_ROUTER_HTTP_OPENAI_CHOICE_H_
