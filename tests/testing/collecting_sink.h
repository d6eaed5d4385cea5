// A ResponseSink that records a request's output and lets a test wait for its end.
#ifndef STRATA_TESTS_TESTING_COLLECTING_SINK_H_
#define STRATA_TESTS_TESTING_COLLECTING_SINK_H_

#include <condition_variable>
#include <mutex>
#include <string>
#include <vector>

#include "services/router/request.h"

namespace strata::testing {

class CollectingSink : public ResponseSink {
 public:
  void OnTokens(const std::vector<int32_t>& ids, const std::string& text) override {
    std::lock_guard<std::mutex> lock(mu_);
    tokens_.insert(tokens_.end(), ids.begin(), ids.end());
    text_ += text;
    ++messages_;
    if (done_) ++late_messages_;
  }
  void OnLogprobs(const std::vector<TokenLogprobs>& logprobs) override {
    std::lock_guard<std::mutex> lock(mu_);
    logprobs_.insert(logprobs_.end(), logprobs.begin(), logprobs.end());
  }
  void OnScores(const std::vector<TokenLogprobs>& scores) override {
    std::lock_guard<std::mutex> lock(mu_);
    scores_ = scores;
    ++score_messages_;
    if (!tokens_.empty() || done_) ++late_scores_;
  }
  void OnFinish(FinishReason reason, const RequestUsage& usage,
                const absl::Status& status) override {
    std::lock_guard<std::mutex> lock(mu_);
    reason_ = reason;
    usage_ = usage;
    status_ = status;
    done_ = true;
    cv_.notify_all();
  }
  // False if the request did not finish within `seconds`.
  bool Wait(int seconds = 60) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(seconds), [&] { return done_; });
  }
  bool done() {
    std::lock_guard<std::mutex> lock(mu_);
    return done_;
  }
  std::vector<int32_t> tokens() {
    std::lock_guard<std::mutex> lock(mu_);
    return tokens_;
  }
  // The generated tokens' log-probabilities, and with their alternatives.
  std::vector<float> logprobs() { return Values(token_logprobs()); }
  std::vector<TokenLogprobs> token_logprobs() {
    std::lock_guard<std::mutex> lock(mu_);
    return logprobs_;
  }
  // The prompt's (OnScores), and with their alternatives.
  std::vector<float> scores() { return Values(score_logprobs()); }
  std::vector<TokenLogprobs> score_logprobs() {
    std::lock_guard<std::mutex> lock(mu_);
    return scores_;
  }
  // OnScores calls, and those that came after a token or the finish (there should be none).
  int score_messages() {
    std::lock_guard<std::mutex> lock(mu_);
    return score_messages_;
  }
  int late_scores() {
    std::lock_guard<std::mutex> lock(mu_);
    return late_scores_;
  }
  std::string text() {
    std::lock_guard<std::mutex> lock(mu_);
    return text_;
  }
  FinishReason reason() {
    std::lock_guard<std::mutex> lock(mu_);
    return reason_;
  }
  RequestUsage usage() {
    std::lock_guard<std::mutex> lock(mu_);
    return usage_;
  }
  absl::Status status() {
    std::lock_guard<std::mutex> lock(mu_);
    return status_;
  }
  // Token messages that came after the finish (there should be none).
  int late_messages() {
    std::lock_guard<std::mutex> lock(mu_);
    return late_messages_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  static std::vector<float> Values(const std::vector<TokenLogprobs>& all) {
    std::vector<float> values;
    for (const TokenLogprobs& l : all) values.push_back(l.logprob);
    return values;
  }

  std::vector<TokenLogprobs> logprobs_;
  std::vector<TokenLogprobs> scores_;
  int score_messages_ = 0;
  int late_scores_ = 0;
  std::vector<int32_t> tokens_;
  std::string text_;
  int messages_ = 0;
  int late_messages_ = 0;
  bool done_ = false;
  FinishReason reason_ = FinishReason::kNone;
  RequestUsage usage_;
  absl::Status status_;
};

}  // namespace strata::testing

#endif  // STRATA_TESTS_TESTING_COLLECTING_SINK_H_
