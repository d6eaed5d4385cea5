// An OpenAiService behind a real HttpServer on a free port, over a FakeScheduler, with the demo
// model's chat format; and what its tests check replies with. Needs STRATA_SOURCE_DIR.
#ifndef STRATA_TESTS_TESTING_OPENAI_API_H_
#define STRATA_TESTS_TESTING_OPENAI_API_H_

#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "services/router/http/http_server.h"
#include "services/router/http/openai_service.h"
#include "tests/testing/fake_scheduler.h"
#include "tests/testing/http_post.h"

namespace strata::testing {

// One service: the demo's tokenizer (unless `with_tokenizer` is false) and its plain chat
// format, the scheduler's context 64 blocks of 16 tokens. `shaped_logits`: the runner's rows
// have FakeStepRunner::RowLogit's pattern below their peak.
class Api {
 public:
  explicit Api(OpenAiServiceOptions options, bool with_tokenizer = true, bool shaped_logits = false)
      : fake_(with_tokenizer, shaped_logits) {
    service_ = std::make_unique<OpenAiService>(std::move(options), fake_.config, *fake_.scheduler,
                                               with_tokenizer ? fake_.tokenizer.get() : nullptr,
                                               *ChatTemplate::FromModelDir(DemoModelDir()));
    server_ = *HttpServer::Start({}, [this](const HttpRequest& request, HttpResponder& responder) {
      service_->Handle(request, responder);
    });
  }
  ~Api() { server_->Shutdown(); }

  HttpReply Call(const std::string& method, const std::string& path, const std::string& body = "",
                 const std::vector<std::string>& headers = {}) {
    return Exchange(server_->port(), method, path, body, headers);
  }
  HttpReply Post(const std::string& path, const Json& body,
                 const std::vector<std::string>& headers = {}) {
    return Call("POST", path, body.dump(), headers);
  }
  // Every request's reply is `text` (its tokens), then the end of sequence (see
  // FakeStepRunner::SetScript).
  void SetScript(const std::string& text) { fake_.SetScript(text); }
  const Tokenizer& tokenizer() const { return *fake_.tokenizer; }
  int port() const { return server_->port(); }
  const Scheduler& scheduler() const { return *fake_.scheduler; }
  int64_t vocab() const { return fake_.config.vocab_size; }

 private:
  FakeScheduler fake_;
  std::unique_ptr<OpenAiService> service_;
  std::unique_ptr<HttpServer> server_;
};

inline OpenAiServiceOptions Named(const std::string& name, const std::string& api_key = "") {
  OpenAiServiceOptions options;
  options.model_name = name;
  options.api_key = api_key;
  return options;
}

inline Json BodyOf(const HttpReply& reply) { return Json::parse(reply.body, nullptr, false); }

// The JSON events of a streamed reply (its `data: ` lines but [DONE]), in order.
inline std::vector<Json> StreamEvents(const HttpReply& reply) {
  std::vector<Json> events;
  size_t at = 0;
  while ((at = reply.body.find("data: ", at)) != std::string::npos) {
    const size_t end = reply.body.find('\n', at);
    const std::string data = reply.body.substr(at + 6, end - at - 6);
    if (data != "[DONE]") events.push_back(Json::parse(data, nullptr, false));
    at = end;
  }
  return events;
}

// A 4xx reply's OpenAI-style error: its param and code ("" for null).
inline void ExpectError(const HttpReply& reply, int status, const std::string& param,
                        const std::string& code = "") {
  EXPECT_EQ(reply.status, status) << reply.body;
  const Json body = BodyOf(reply);
  ASSERT_TRUE(body.contains("error")) << reply.body;
  const Json& e = body["error"];
  EXPECT_FALSE(e["message"].get<std::string>().empty());
  EXPECT_EQ(e["param"].is_null() ? "" : e["param"].get<std::string>(), param) << reply.body;
  EXPECT_EQ(e["code"].is_null() ? "" : e["code"].get<std::string>(), code) << reply.body;
}

}  // namespace strata::testing

#endif  // STRATA_TESTS_TESTING_OPENAI_API_H_
