// GenerationService alone: its gRPC handlers on a local server over a FakeScheduler (no model
// weights; the demo model's tokenizer).
#include "services/router/generation_service.h"

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "strata/v1/generation.grpc.pb.h"
#include "tests/testing/fake_scheduler.h"

namespace strata {
namespace {

class GenerationServiceTest : public ::testing::Test {
 protected:
  GenerationServiceTest() {
    service_ = std::make_unique<GenerationService>(fake_.config, *fake_.scheduler,
                                                   fake_.tokenizer.get(), /*num_workers=*/3);
    int port = 0;
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    stub_ = v1::Generation::NewStub(
        grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials()));
  }
  ~GenerationServiceTest() override { server_->Shutdown(); }

  // Every request's reply: `text`'s tokens, then the end of sequence.
  std::vector<uint32_t> Script(const std::string& text) {
    const std::vector<int32_t> ids = fake_.SetScript(text);
    return std::vector<uint32_t>(ids.begin(), ids.end());
  }

  // The messages of one Generate call, and its status.
  grpc::Status Generate(const v1::GenerateRequest& request,
                        std::vector<v1::GenerateResponse>& messages) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    auto reader = stub_->Generate(&context, request);
    v1::GenerateResponse message;
    while (reader->Read(&message)) messages.push_back(message);
    return reader->Finish();
  }

  testing::FakeScheduler fake_;
  std::unique_ptr<GenerationService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<v1::Generation::Stub> stub_;
};

TEST_F(GenerationServiceTest, ATextPromptStreamsTheRepliesTokensAndText) {
  const std::vector<uint32_t> reply = Script("Once upon a time");
  v1::GenerateRequest request;
  request.set_prompt("It is a truth");
  request.set_max_new_tokens(32);
  std::vector<v1::GenerateResponse> messages;
  ASSERT_TRUE(Generate(request, messages).ok());
  ASSERT_FALSE(messages.empty());
  std::vector<uint32_t> tokens;
  std::string text;
  for (const v1::GenerateResponse& m : messages) {
    tokens.insert(tokens.end(), m.token_ids().begin(), m.token_ids().end());
    text += m.text();
  }
  std::vector<uint32_t> expected = reply;
  expected.push_back(0);  // the end of sequence
  EXPECT_EQ(tokens, expected);
  EXPECT_EQ(text, "Once upon a time");
  const v1::GenerateResponse& last = messages.back();
  EXPECT_EQ(last.finish_reason(), v1::FINISH_REASON_EOS);
  EXPECT_EQ(last.usage().prompt_tokens(),
            fake_.tokenizer->Encode("It is a truth", /*add_special_tokens=*/true)->size());
  EXPECT_EQ(last.usage().completion_tokens(), expected.size());
}

// Greedy samples of one prompt (the runner's tokens a function of token and position) are the
// same tokens, each in messages with its own index, each with its own end.
TEST_F(GenerationServiceTest, SamplesOfOnePromptCarryTheirIndex) {
  v1::GenerateRequest request;
  request.add_prompt_token_ids(5);
  request.add_prompt_token_ids(6);
  request.set_max_new_tokens(8);
  request.set_ignore_eos(true);
  request.set_n(3);
  std::vector<v1::GenerateResponse> messages;
  ASSERT_TRUE(Generate(request, messages).ok());
  std::vector<std::vector<uint32_t>> tokens(3);
  int finished = 0;
  for (const v1::GenerateResponse& m : messages) {
    ASSERT_LT(m.index(), 3u);
    tokens[m.index()].insert(tokens[m.index()].end(), m.token_ids().begin(), m.token_ids().end());
    if (m.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) {
      ++finished;
      EXPECT_EQ(m.finish_reason(), v1::FINISH_REASON_LENGTH);
      EXPECT_EQ(m.usage().prompt_tokens(), 2u);
      EXPECT_EQ(m.usage().completion_tokens(), 8u);
    }
  }
  EXPECT_EQ(finished, 3);
  EXPECT_EQ(tokens[0].size(), 8u);
  EXPECT_EQ(tokens[1], tokens[0]);
  EXPECT_EQ(tokens[2], tokens[0]);
}

TEST_F(GenerationServiceTest, BadRequestsAreRefusedNamingWhatIsWrong) {
  struct Case {
    std::string what;
    v1::GenerateRequest request;
  };
  std::vector<Case> cases(4);
  cases[0].what = "prompt";  // neither a prompt nor token ids
  cases[1].what = "n";
  cases[1].request.add_prompt_token_ids(5);
  cases[1].request.set_n(17);
  cases[2].what = "top_p";
  cases[2].request.add_prompt_token_ids(5);
  cases[2].request.mutable_sampling()->set_top_p(2.0f);
  cases[3].what = "prompt token id";  // beyond the vocabulary
  cases[3].request.add_prompt_token_ids(static_cast<uint32_t>(fake_.config.vocab_size) + 7);
  for (Case& c : cases) {
    c.request.set_max_new_tokens(4);
    std::vector<v1::GenerateResponse> messages;
    const grpc::Status status = Generate(c.request, messages);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << c.what;
    EXPECT_TRUE(absl::StrContains(status.error_message(), c.what))
        << c.what << ": " << status.error_message();
    EXPECT_TRUE(messages.empty()) << c.what;
  }
}

TEST_F(GenerationServiceTest, ModelInfoAndTheTokenizerRoundTrip) {
  grpc::ClientContext info_context;
  v1::ModelInfoResponse info;
  ASSERT_TRUE(stub_->ModelInfo(&info_context, v1::ModelInfoRequest(), &info).ok());
  EXPECT_EQ(info.vocab_size(), static_cast<uint32_t>(fake_.config.vocab_size));
  EXPECT_EQ(info.num_workers(), 3u);
  EXPECT_TRUE(info.has_tokenizer());
  EXPECT_EQ(std::vector<uint32_t>(info.eos_token_ids().begin(), info.eos_token_ids().end()),
            std::vector<uint32_t>{0});

  grpc::ClientContext tokenize_context;
  v1::TokenizeRequest tokenize;
  tokenize.set_text("Call me Ishmael.");
  v1::TokenizeResponse ids;
  ASSERT_TRUE(stub_->Tokenize(&tokenize_context, tokenize, &ids).ok());
  ASSERT_FALSE(ids.token_ids().empty());
  grpc::ClientContext detokenize_context;
  v1::DetokenizeRequest detokenize;
  detokenize.mutable_token_ids()->CopyFrom(ids.token_ids());
  v1::DetokenizeResponse text;
  ASSERT_TRUE(stub_->Detokenize(&detokenize_context, detokenize, &text).ok());
  EXPECT_EQ(text.text(), "Call me Ishmael.");
}

}  // namespace
}  // namespace strata
