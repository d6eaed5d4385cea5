#include "services/router/http/openai_choice.h"

namespace strata {

const char* FinishName(FinishReason reason) {
  switch (reason) {
    case FinishReason::kLength:
      return "length";
    case FinishReason::kStop:
    case FinishReason::kEos:
      return "stop";
    default:
      return "abort";
  }
}

OpenAiChoice::OpenAiChoice(int index, const OpenAiRequest& request,
                           std::function<std::string(int32_t)> token_text,
                           std::unique_ptr<ChatToolCalls> tool_calls)
    : index_(index),
      chat_(request.chat),
      stream_(request.stream),
      logprobs_(request.logprobs),
      token_text_(token_text),
      logprob_list_(request.chat, request.top_logprobs, std::move(token_text)),
      tool_calls_(std::move(tool_calls)) {}

Json OpenAiChoice::StreamChoice(Json content) {
  Json choice{{"index", index_}};
  if (chat_) {
    choice["delta"] = std::move(content);
  } else {
    choice["text"] = std::move(content);
  }
  choice["logprobs"] = logprobs_ ? logprob_list_.Take() : Json(nullptr);
  choice["finish_reason"] = nullptr;
  return choice;
}

std::vector<Json> OpenAiChoice::Start() {
  if (!stream_ || !chat_) return {};
  Json choice{{"index", index_},
              {"delta", Json{{"role", "assistant"}, {"content", ""}}},
              {"logprobs", nullptr},
              {"finish_reason", nullptr}};
  return {std::move(choice)};
}

std::vector<Json> OpenAiChoice::Text(const std::string& piece) {
  text_ += piece;
  std::vector<Json> deltas;
  if (tool_calls_ != nullptr) {
    deltas = tool_calls_->Feed(piece);
  } else if (!piece.empty()) {
    deltas.push_back(chat_ ? Json{{"content", piece}} : Json(piece));
  }
  if (!stream_) return {};
  // A chunk goes out for log-probabilities even when the parser holds the text back.
  if (deltas.empty() && logprobs_) deltas.push_back(chat_ ? Json{{"content", ""}} : Json(""));
  std::vector<Json> choices;
  for (Json& delta : deltas) choices.push_back(StreamChoice(std::move(delta)));
  return choices;
}

std::vector<Json> OpenAiChoice::Echo(const std::string& text, const std::vector<int32_t>& prompt,
                                     const std::vector<TokenLogprobs>* scores) {
  if (scores != nullptr) {
    // The first prompt token has no log-probability: nothing comes before it.
    size_t offset = text_.size();
    for (size_t i = 0; i < prompt.size(); ++i) {
      const TokenLogprobs* l = i > 0 && i - 1 < scores->size() ? &(*scores)[i - 1] : nullptr;
      logprob_list_.Add(prompt[i], l, offset);
      offset += token_text_(prompt[i]).size();
    }
  }
  return Text(text);
}

std::vector<Json> OpenAiChoice::Add(const std::vector<int32_t>& ids, const std::string& text,
                                    const std::vector<TokenLogprobs>& logprobs) {
  if (logprobs_) {
    size_t offset = text_.size();
    for (size_t i = 0; i < ids.size() && i < logprobs.size(); ++i) {
      logprob_list_.Add(ids[i], &logprobs[i], offset);
      offset += token_text_(ids[i]).size();
    }
  }
  return Text(text);
}

std::vector<Json> OpenAiChoice::Finish(FinishReason reason) {
  finish_ = FinishName(reason);
  std::vector<Json> choices;
  if (tool_calls_ != nullptr) {
    for (Json& delta : tool_calls_->Finish()) {
      if (stream_) choices.push_back(StreamChoice(std::move(delta)));
    }
    if (tool_calls_->called()) finish_ = "tool_calls";
  }
  if (!stream_) return {};
  Json last{{"index", index_}};
  if (chat_) {
    last["delta"] = Json::object();
  } else {
    last["text"] = "";
  }
  last["logprobs"] = nullptr;
  last["finish_reason"] = finish_;
  choices.push_back(std::move(last));
  return choices;
}

Json OpenAiChoice::Whole() {
  Json choice{{"index", index_}};
  if (chat_) {
    choice["message"] = Json{{"role", "assistant"}, {"content", text_}};
    if (tool_calls_ != nullptr) {
      choice["message"]["content"] = tool_calls_->content();
      if (tool_calls_->called()) choice["message"]["tool_calls"] = tool_calls_->tool_calls();
    }
  } else {
    choice["text"] = text_;
  }
  choice["logprobs"] = logprobs_ ? logprob_list_.Take() : Json(nullptr);
  choice["finish_reason"] = finish_;
  return choice;
}

}  // namespace strata
