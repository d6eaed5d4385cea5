#include "services/router/http/openai_logprobs.h"

#include <algorithm>
#include <utility>

namespace strata {
namespace {

// What OpenAI and vLLM write for a log-probability too small for a float: JSON has no -inf.
float Finite(float logprob) { return std::max(logprob, -9999.0f); }

Json Bytes(const std::string& text) {
  Json bytes = Json::array();
  for (unsigned char c : text) bytes.push_back(static_cast<int>(c));
  return bytes;
}

}  // namespace

OpenAiLogprobs::OpenAiLogprobs(bool chat, int top, std::function<std::string(int32_t)> token_text)
    : chat_(chat), top_(top), token_text_(std::move(token_text)), json_(Empty()) {}

Json OpenAiLogprobs::Empty() const {
  if (chat_) return Json{{"content", Json::array()}};
  return Json{{"tokens", Json::array()},
              {"token_logprobs", Json::array()},
              {"top_logprobs", Json::array()},
              {"text_offset", Json::array()}};
}

void OpenAiLogprobs::Add(int32_t id, const TokenLogprobs* logprobs, size_t offset) {
  const std::string token = token_text_(id);
  if (chat_) {
    // Chat has no echoed prompt: every token has its log-probabilities.
    const float logprob = logprobs != nullptr ? Finite(logprobs->logprob) : 0.0f;
    Json top = Json::array();
    if (logprobs != nullptr) {
      for (const auto& [alt, alt_logprob] : logprobs->top) {
        const std::string text = token_text_(alt);
        top.push_back(
            Json{{"token", text}, {"logprob", Finite(alt_logprob)}, {"bytes", Bytes(text)}});
      }
    }
    json_["content"].push_back(Json{
        {"token", token}, {"logprob", logprob}, {"bytes", Bytes(token)}, {"top_logprobs", top}});
    return;
  }
  json_["tokens"].push_back(token);
  json_["text_offset"].push_back(offset);
  if (logprobs == nullptr) {
    json_["token_logprobs"].push_back(nullptr);
    json_["top_logprobs"].push_back(nullptr);
    return;
  }
  json_["token_logprobs"].push_back(Finite(logprobs->logprob));
  // Most likely first; the chosen token last when it is not among them. Tokens of the same
  // text share a key: the more likely one's value stays.
  Json top = Json::object();
  for (const auto& [alt, alt_logprob] : logprobs->top) {
    const std::string text = token_text_(alt);
    if (!top.contains(text)) top[text] = Finite(alt_logprob);
  }
  if (!top.contains(token)) top[token] = Finite(logprobs->logprob);
  json_["top_logprobs"].push_back(std::move(top));
}

Json OpenAiLogprobs::Take() {
  Json out = std::move(json_);
  json_ = Empty();
  return out;
}

}  // namespace strata
