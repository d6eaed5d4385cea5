// A Scheduler whose steps a FakeStepRunner answers (no model weights), with the demo model's
// tokenizer: what the front-end tests (OpenAI, gRPC) put their service over. Its KV cache holds
// 64 blocks of 16 tokens. Needs STRATA_SOURCE_DIR.
#ifndef STRATA_TESTS_TESTING_FAKE_SCHEDULER_H_
#define STRATA_TESTS_TESTING_FAKE_SCHEDULER_H_

#include <memory>
#include <string>
#include <vector>

#include "services/router/scheduler.h"
#include "tests/testing/fake_step_runner.h"

namespace strata::testing {

inline const std::string& DemoModelDir() {
  static const std::string* dir =
      new std::string(std::string(STRATA_SOURCE_DIR) + "/models/strata-demo");
  return *dir;
}

struct FakeScheduler {
  // with_tokenizer false: the scheduler gets none (ids only); shaped_logits: the runner's rows
  // have FakeStepRunner::RowLogit's pattern below their peak.
  explicit FakeScheduler(bool with_tokenizer = true, bool shaped_logits = false)
      : tokenizer(*Tokenizer::FromFile(DemoModelDir() + "/tokenizer.json")),
        config(FakeConfig(tokenizer->vocab_size())),
        kv(*PagedKvCache::Create({.cache = {.block_size = 16},
                                  .num_blocks = 64,
                                  .num_layers = 1,
                                  .num_kv_heads = 1,
                                  .head_dim = 1})),
        runner(kv, config.vocab_size) {
    runner.shaped_logits = shaped_logits;
    scheduler = std::make_unique<Scheduler>(
        config, runner, kv, with_tokenizer ? tokenizer.get() : nullptr, SchedulerOptions{});
    scheduler->Start();
  }

  // Every request's reply: `text`'s tokens, then the end of sequence (FakeStepRunner::SetScript).
  std::vector<int32_t> SetScript(const std::string& text) {
    std::vector<int32_t> ids = *tokenizer->Encode(text, /*add_special_tokens=*/false);
    runner.SetScript(ids);
    return ids;
  }

  std::unique_ptr<Tokenizer> tokenizer;
  ModelConfig config;
  PagedKvCache kv;
  FakeStepRunner runner;
  std::unique_ptr<Scheduler> scheduler;
};

}  // namespace strata::testing

#endif  // STRATA_TESTS_TESTING_FAKE_SCHEDULER_H_
