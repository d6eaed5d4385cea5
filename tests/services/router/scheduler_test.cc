// Continuous batching against the one-request-at-a-time reference: same tokens whatever the
// mix, through chunked prefill, preemption and cancellation.
#include "services/router/scheduler.h"

#include <future>
#include <memory>
#include <random>

#include "absl/strings/str_cat.h"
#include "common/engine/local_engine.h"
#include "common/engine/model_stack.h"
#include "gtest/gtest.h"
#include "services/router/draft_model.h"
#include "tests/testing/collecting_sink.h"

namespace strata {
namespace {

using ::strata::testing::CollectingSink;

const std::string kModelDir = std::string(STRATA_TEST_DATA_DIR) + "/oracles/qwen3_moe_long";

// A scheduler over the CPU backends with a KV pool of `num_blocks` blocks of 4 tokens.
class SchedulerHarness {
 public:
  SchedulerHarness(int num_blocks, SchedulerOptions options, bool prefix_caching = false) {
    ModelStackOptions stack;
    stack.num_threads = 2;
    stack.kv.block_size = 4;
    stack.kv_blocks = num_blocks;
    stack.kv.prefix_caching = prefix_caching;
    stack_ = *ModelStack::Create(kModelDir, stack);
    runner_ = CreateStepRunner(stack_->config(), stack_->router(), *stack_->experts(), stack_->kv(),
                               StepRunnerOptions{});
    scheduler_ =
        std::make_unique<Scheduler>(stack_->config(), *runner_, stack_->kv(), nullptr, options);
    scheduler_->Start();
  }
  Scheduler& scheduler() { return *scheduler_; }
  PagedKvCache& kv() { return stack_->kv(); }

 private:
  std::unique_ptr<ModelStack> stack_;
  std::unique_ptr<StepRunner> runner_;
  std::unique_ptr<Scheduler> scheduler_;
};

std::vector<RequestSpec> MixedRequests(int count, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<RequestSpec> specs(count);
  for (int i = 0; i < count; ++i) {
    const int len = 1 + static_cast<int>(rng() % 60);
    for (int j = 0; j < len; ++j) specs[i].prompt.push_back(3 + static_cast<int32_t>(rng() % 700));
    specs[i].max_new_tokens = 1 + static_cast<int>(rng() % 12);
    specs[i].ignore_eos = true;
    if (i % 3 == 0)
      specs[i].sampling = {.temperature = 0.8f, .top_k = 20, .top_p = 0.9f, .seed = 100u + i};
  }
  return specs;
}

// `count` requests as MixedRequests makes them, with prompts of `prompt_len` tokens and
// `max_new_tokens` each.
std::vector<RequestSpec> SizedRequests(int count, uint64_t seed, int prompt_len,
                                       int max_new_tokens) {
  std::vector<RequestSpec> specs = MixedRequests(count, seed);
  for (RequestSpec& spec : specs) {
    spec.prompt.resize(prompt_len, 5);
    spec.max_new_tokens = max_new_tokens;
  }
  return specs;
}

std::vector<int32_t> RunAlone(const RequestSpec& spec) {
  LocalEngineOptions options;
  options.model_dir = kModelDir;
  options.num_threads = 2;
  static std::unique_ptr<LocalEngine> engine = *LocalEngine::Create(options);
  GenerateOptions g;
  g.max_new_tokens = spec.max_new_tokens;
  g.sampling = spec.sampling;
  g.ignore_eos = spec.ignore_eos;
  return *engine->Generate(spec.prompt, g);
}

// Submits every request at once (a refused one fails the test); their sinks in order.
std::vector<std::shared_ptr<CollectingSink>> SubmitAll(SchedulerHarness& harness,
                                                       const std::vector<RequestSpec>& specs) {
  std::vector<std::shared_ptr<CollectingSink>> sinks;
  for (const RequestSpec& spec : specs) {
    sinks.push_back(std::make_shared<CollectingSink>());
    EXPECT_TRUE(harness.scheduler().Submit(spec, sinks.back()).ok());
  }
  return sinks;
}

// Submits every request at once, then checks each one's tokens against running it alone.
void ExpectTokensOfOneAtATime(SchedulerHarness& harness, const std::vector<RequestSpec>& specs) {
  const std::vector<std::shared_ptr<CollectingSink>> sinks = SubmitAll(harness, specs);
  for (size_t i = 0; i < specs.size(); ++i) {
    ASSERT_TRUE(sinks[i]->Wait());
    EXPECT_EQ(sinks[i]->tokens(), RunAlone(specs[i])) << "request " << i;
  }
}

TEST(SchedulerTest, ConcurrentRequestsMatchOneAtATime) {
  SchedulerHarness harness(/*num_blocks=*/512, {.max_batch_tokens = 40, .max_running = 16});
  const std::vector<RequestSpec> specs = MixedRequests(32, 7);
  const std::vector<std::shared_ptr<CollectingSink>> sinks = SubmitAll(harness, specs);
  for (size_t i = 0; i < specs.size(); ++i) {
    ASSERT_TRUE(sinks[i]->Wait());
    EXPECT_EQ(sinks[i]->reason(), FinishReason::kLength);
    EXPECT_EQ(sinks[i]->tokens(), RunAlone(specs[i])) << "request " << i;
    EXPECT_EQ(sinks[i]->usage().completion_tokens, specs[i].max_new_tokens);
    EXPECT_EQ(sinks[i]->late_messages(), 0) << "request " << i;
  }
  EXPECT_EQ(harness.kv().free_blocks(), 512);
}

// Each generated token's log-probability is what scoring the whole sequence gives it, greedy
// or sampled (the distribution before temperature and top-k), and asking for it changes no
// token.
TEST(SchedulerTest, LogprobsMatchScores) {
  SchedulerHarness harness(/*num_blocks=*/256, {.max_batch_tokens = 32, .max_running = 8});
  std::vector<RequestSpec> specs = MixedRequests(6, 21);
  for (RequestSpec& spec : specs) spec.logprobs = true;
  const std::vector<std::shared_ptr<CollectingSink>> sinks = SubmitAll(harness, specs);
  for (size_t i = 0; i < specs.size(); ++i) {
    ASSERT_TRUE(sinks[i]->Wait());
    const std::vector<int32_t> tokens = sinks[i]->tokens();
    EXPECT_EQ(tokens, RunAlone(specs[i])) << "request " << i;
    const std::vector<float> logprobs = sinks[i]->logprobs();
    ASSERT_EQ(logprobs.size(), tokens.size()) << "request " << i;
    RequestSpec score;
    score.score_only = true;
    score.prompt = specs[i].prompt;
    score.prompt.insert(score.prompt.end(), tokens.begin(), tokens.end());
    auto scored = std::make_shared<CollectingSink>();
    ASSERT_TRUE(harness.scheduler().Submit(score, scored).ok());
    ASSERT_TRUE(scored->Wait());
    const std::vector<float> scores = scored->scores();
    const size_t prompt = specs[i].prompt.size();
    for (size_t j = 0; j < tokens.size(); ++j) {
      EXPECT_LE(logprobs[j], 0.0f);
      EXPECT_NEAR(logprobs[j], scores[prompt - 1 + j], 1e-3) << "request " << i << " token " << j;
    }
  }
}

// `top` most likely first, ties by lower id, none above the chosen token's unless the chosen
// token is in the list (where it has its value).
void ExpectConsistentTop(const TokenLogprobs& l, int32_t chosen, size_t top,
                         const std::string& where) {
  ASSERT_EQ(l.top.size(), top) << where;
  bool seen = false;
  for (size_t k = 0; k < l.top.size(); ++k) {
    if (k > 0) {
      EXPECT_TRUE(l.top[k - 1].second > l.top[k].second ||
                  (l.top[k - 1].second == l.top[k].second && l.top[k - 1].first < l.top[k].first))
          << where << " rank " << k;
    }
    if (l.top[k].first == chosen) {
      seen = true;
      EXPECT_EQ(l.top[k].second, l.logprob) << where;
    }
  }
  if (!seen && !l.top.empty()) EXPECT_LE(l.logprob, l.top.back().second) << where;
}

// prompt_logprobs: the prompt's log-probabilities come once, before the first token, equal to a
// score-only request's (alternatives too), computed in chunks and past a cached prefix; the
// generated tokens are unchanged and carry their alternatives (a greedy token is the first).
TEST(SchedulerTest, PromptLogprobsComeBeforeTheTokensWithAlternatives) {
  SchedulerHarness harness(/*num_blocks=*/256, {.max_batch_tokens = 16, .max_running = 8},
                           /*prefix_caching=*/true);
  std::vector<RequestSpec> specs = MixedRequests(6, 29);
  specs[1].prompt = {7};  // nothing to score
  // Its prefix is cached by the time it comes: scoring must compute it anyway.
  RequestSpec warm = specs[2];
  warm.max_new_tokens = 1;
  auto warm_sink = std::make_shared<CollectingSink>();
  ASSERT_TRUE(harness.scheduler().Submit(warm, warm_sink).ok());
  ASSERT_TRUE(warm_sink->Wait());
  for (size_t i = 0; i < specs.size(); ++i) {
    specs[i].prompt_logprobs = true;
    specs[i].logprobs = i % 2 == 0;
    specs[i].top_logprobs = i == 4 ? 0 : 5;
  }
  const std::vector<std::shared_ptr<CollectingSink>> sinks = SubmitAll(harness, specs);
  for (size_t i = 0; i < specs.size(); ++i) {
    ASSERT_TRUE(sinks[i]->Wait());
    const std::string where = absl::StrCat("request ", i);
    const std::vector<int32_t> tokens = sinks[i]->tokens();
    EXPECT_EQ(tokens, RunAlone(specs[i])) << where;
    EXPECT_EQ(sinks[i]->score_messages(), 1) << where;
    EXPECT_EQ(sinks[i]->late_scores(), 0) << where;
    const std::vector<TokenLogprobs> scores = sinks[i]->score_logprobs();
    ASSERT_EQ(scores.size(), specs[i].prompt.size() - 1) << where;

    RequestSpec score;
    score.score_only = true;
    score.prompt = specs[i].prompt;
    score.top_logprobs = specs[i].top_logprobs;
    auto scored = std::make_shared<CollectingSink>();
    ASSERT_TRUE(harness.scheduler().Submit(score, scored).ok());
    ASSERT_TRUE(scored->Wait());
    const std::vector<TokenLogprobs> want = scored->score_logprobs();
    ASSERT_EQ(want.size(), scores.size()) << where;
    for (size_t j = 0; j < scores.size(); ++j) {
      const std::string at = absl::StrCat(where, " prompt token ", j + 1);
      EXPECT_NEAR(scores[j].logprob, want[j].logprob, 1e-3) << at;
      ExpectConsistentTop(scores[j], specs[i].prompt[j + 1], specs[i].top_logprobs, at);
      ASSERT_EQ(scores[j].top.size(), want[j].top.size()) << at;
      for (size_t k = 0; k < want[j].top.size(); ++k) {
        EXPECT_NEAR(scores[j].top[k].second, want[j].top[k].second, 1e-3) << at;
      }
    }

    const std::vector<TokenLogprobs> logprobs = sinks[i]->token_logprobs();
    if (!specs[i].logprobs) {
      EXPECT_TRUE(logprobs.empty()) << where;
      continue;
    }
    ASSERT_EQ(logprobs.size(), tokens.size()) << where;
    for (size_t j = 0; j < tokens.size(); ++j) {
      const std::string at = absl::StrCat(where, " token ", j);
      ExpectConsistentTop(logprobs[j], tokens[j], specs[i].top_logprobs, at);
      if (specs[i].sampling.temperature == 0.0f && !logprobs[j].top.empty()) {
        EXPECT_EQ(logprobs[j].top[0].first, tokens[j]) << at;
      }
    }
  }
}

// Decodes outgrowing the pool are preempted and recomputed from their prompt: each prompt's
// log-probabilities still come once, all of them.
TEST(SchedulerTest, PromptLogprobsComeOnceThroughPreemption) {
  SchedulerHarness harness(/*num_blocks=*/20, {.max_batch_tokens = 64, .max_running = 12});
  std::vector<RequestSpec> specs = SizedRequests(4, 17, /*prompt_len=*/8, /*max_new_tokens=*/40);
  for (RequestSpec& spec : specs) spec.prompt_logprobs = true;
  const std::vector<std::shared_ptr<CollectingSink>> sinks = SubmitAll(harness, specs);
  for (size_t i = 0; i < specs.size(); ++i) {
    ASSERT_TRUE(sinks[i]->Wait());
    EXPECT_EQ(sinks[i]->tokens(), RunAlone(specs[i])) << "request " << i;
    EXPECT_EQ(sinks[i]->score_messages(), 1) << "request " << i;
    EXPECT_EQ(sinks[i]->scores().size(), specs[i].prompt.size() - 1) << "request " << i;
  }
  EXPECT_GT(harness.scheduler().stats().preemptions, 0);
  EXPECT_EQ(harness.kv().free_blocks(), 20);
}

TEST(SchedulerTest, SmallPoolKeepsTheTokens) {
  // 40 blocks of 4 tokens cannot hold twelve requests of up to 70 tokens at once: some wait
  // for blocks (or are preempted, as their decodes grow).
  SchedulerHarness harness(/*num_blocks=*/40, {.max_batch_tokens = 64, .max_running = 12});
  const std::vector<RequestSpec> specs = MixedRequests(12, 11);
  ExpectTokensOfOneAtATime(harness, specs);
  EXPECT_EQ(harness.kv().free_blocks(), 40);
}

// Six prompts of six blocks each against a pool of 20: three run at a time and the others wait
// for their blocks instead of being admitted and preempted.
TEST(SchedulerTest, AdmissionWaitsForBlocksInsteadOfPreempting) {
  // A step's budget takes every prompt at once: admitted together, they would not fit.
  SchedulerHarness harness(/*num_blocks=*/20, {.max_batch_tokens = 256, .max_running = 12});
  ExpectTokensOfOneAtATime(harness, SizedRequests(6, 13, /*prompt_len=*/24, /*max_new_tokens=*/1));
  EXPECT_EQ(harness.scheduler().stats().preemptions, 0);
  EXPECT_EQ(harness.kv().free_blocks(), 20);
}

// Prompts of one block that grow to eleven blocks each outgrow a pool of 20 while decoding:
// some are preempted and recomputed, with the same tokens.
TEST(SchedulerTest, DecodesOutgrowingThePoolPreemptAndKeepTheTokens) {
  SchedulerHarness harness(/*num_blocks=*/20, {.max_batch_tokens = 64, .max_running = 12});
  ExpectTokensOfOneAtATime(harness, SizedRequests(4, 17, /*prompt_len=*/4, /*max_new_tokens=*/40));
  EXPECT_GT(harness.scheduler().stats().preemptions, 0);
  EXPECT_EQ(harness.kv().free_blocks(), 20);
}

// Compaction while requests decode: cached blocks fill the low end, the running requests get
// blocks past the new end, and shrinking the pool moves them below it (evicting cached ones)
// without changing a token. Too small a pool is refused.
TEST(SchedulerTest, ResizingThePoolWhileRequestsRunKeepsTheirTokens) {
  SchedulerHarness harness(/*num_blocks=*/256,
                           {.max_batch_tokens = 64, .max_running = 4, .max_context_tokens = 256},
                           /*prefix_caching=*/true);
  auto resize = [&](int blocks) {
    std::promise<absl::StatusOr<Scheduler::KvResize>> promise;
    harness.scheduler().ResizeKv(
        blocks, [&](absl::StatusOr<Scheduler::KvResize> r) { promise.set_value(std::move(r)); });
    return promise.get_future().get();
  };
  // 60 blocks of a finished prompt stay cached at the low end.
  RequestSpec pad = SizedRequests(1, 3, 240, 1)[0];
  for (size_t i = 0; i < pad.prompt.size(); ++i) pad.prompt[i] = 3 + static_cast<int32_t>(i);
  auto pad_sink = std::make_shared<CollectingSink>();
  ASSERT_TRUE(harness.scheduler().Submit(pad, pad_sink).ok());
  ASSERT_TRUE(pad_sink->Wait());

  std::vector<RequestSpec> specs = {SizedRequests(1, 11, 120, 30)[0],
                                    SizedRequests(1, 12, 80, 30)[0]};
  const std::vector<std::shared_ptr<CollectingSink>> sinks = SubmitAll(harness, specs);
  while (sinks[0]->tokens().size() < 2 || sinks[1]->tokens().size() < 2) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  const absl::StatusOr<Scheduler::KvResize> shrunk = resize(70);
  ASSERT_TRUE(shrunk.ok()) << shrunk.status();
  EXPECT_EQ(shrunk->blocks, 70);
  EXPECT_GT(shrunk->moved_blocks, 0);
  EXPECT_EQ(harness.scheduler().kv_pool_blocks(), 70);
  for (size_t i = 0; i < specs.size(); ++i) {
    ASSERT_TRUE(sinks[i]->Wait());
    EXPECT_EQ(sinks[i]->tokens(), RunAlone(specs[i])) << "request " << i;
  }
  // One 256-token sequence takes 64 blocks: 63 is refused.
  EXPECT_EQ(resize(63).status().code(), absl::StatusCode::kFailedPrecondition);
  const absl::StatusOr<Scheduler::KvResize> grown = resize(256);
  ASSERT_TRUE(grown.ok()) << grown.status();
  EXPECT_EQ(grown->moved_blocks, 0);
  ExpectTokensOfOneAtATime(harness, MixedRequests(6, 21));
}

// Speculation by prompt lookup: greedy rows give exactly their tokens without it, drafts are
// made and accepted (the oracle model's greedy output repeats itself), sampled rows run to their
// length (their distribution is Sampler::AcceptDraft's test), and a second run gives the greedy
// rows the same tokens.
TEST(SchedulerTest, PromptLookupSpeculationKeepsGreedyTokens) {
  SchedulerOptions options{.max_batch_tokens = 48, .max_running = 8};
  options.speculation.max_draft_tokens = 4;
  SchedulerHarness harness(/*num_blocks=*/512, options);
  std::vector<RequestSpec> specs = SizedRequests(6, 31, 24, 40);
  for (int i = 0; i < 6; ++i) {
    for (size_t j = 0; j < specs[i].prompt.size(); ++j) {
      specs[i].prompt[j] = 10 + static_cast<int32_t>((j * (i + 1)) % 7);  // repetitive
    }
    if (i % 2 == 1) specs[i].sampling = {};  // MixedRequests samples some: these are greedy
  }
  specs[0].sampling = {};
  const std::vector<std::shared_ptr<CollectingSink>> sinks = SubmitAll(harness, specs);
  for (size_t i = 0; i < specs.size(); ++i) {
    ASSERT_TRUE(sinks[i]->Wait());
    EXPECT_EQ(sinks[i]->tokens().size(), 40u) << "request " << i;
    if (specs[i].sampling.temperature == 0.0f) {
      EXPECT_EQ(sinks[i]->tokens(), RunAlone(specs[i])) << "request " << i;
    }
  }
  const Scheduler::Stats stats = harness.scheduler().stats();
  EXPECT_GT(stats.draft_tokens, 0);
  EXPECT_GT(stats.accepted_draft_tokens, 0);
  EXPECT_LE(stats.accepted_draft_tokens, stats.draft_tokens);
  EXPECT_GT(stats.draft_steps, 0);
  EXPECT_EQ(harness.kv().free_blocks(), 512);

  // The same requests again, one at a time (other drafts, other batches).
  SchedulerHarness again(/*num_blocks=*/512, options);
  for (size_t i = 0; i < specs.size(); ++i) {
    auto sink = std::make_shared<CollectingSink>();
    ASSERT_TRUE(again.scheduler().Submit(specs[i], sink).ok());
    ASSERT_TRUE(sink->Wait());
    if (specs[i].sampling.temperature > 0.0f) {
      EXPECT_EQ(sink->tokens().size(), 40u);
    } else {
      EXPECT_EQ(sink->tokens(), sinks[i]->tokens()) << "request " << i;
    }
  }
}

// Drafts from a draft model (here the target model itself, so its greedy drafts are the target's
// own greedy tokens): greedy rows keep their tokens, nearly every draft stands, and the draft's
// state of each sequence goes when it ends.
TEST(SchedulerTest, DraftModelSpeculationKeepsGreedyTokens) {
  SchedulerOptions options{.max_batch_tokens = 48, .max_running = 8};
  options.speculation.max_draft_tokens = 4;
  auto draft = DraftModel::Create({.model_dir = kModelDir}, 4096);
  EXPECT_TRUE(absl::IsInvalidArgument(draft.status())) << draft.status();  // another vocabulary
  const int64_t vocab =
      ModelStack::Create(kModelDir, {.kv = {.memory_mb = 1}}).value()->config().vocab_size;
  draft = DraftModel::Create({.model_dir = kModelDir}, vocab);
  ASSERT_TRUE(draft.ok()) << draft.status();
  std::shared_ptr<DraftModel> model = *std::move(draft);
  options.speculation.draft_model = model;
  SchedulerHarness harness(/*num_blocks=*/512, options);
  std::vector<RequestSpec> specs = SizedRequests(4, 23, 24, 30);
  for (RequestSpec& spec : specs) spec.sampling = {};
  const std::vector<std::shared_ptr<CollectingSink>> sinks = SubmitAll(harness, specs);
  for (size_t i = 0; i < specs.size(); ++i) {
    ASSERT_TRUE(sinks[i]->Wait());
    EXPECT_EQ(sinks[i]->tokens(), RunAlone(specs[i])) << "request " << i;
  }
  const Scheduler::Stats stats = harness.scheduler().stats();
  std::printf("draft model: %lld of %lld drafted tokens accepted in %lld steps\n",
              static_cast<long long>(stats.accepted_draft_tokens),
              static_cast<long long>(stats.draft_tokens),
              static_cast<long long>(stats.draft_steps));
  EXPECT_GT(stats.draft_tokens, 0);
  EXPECT_GT(stats.accepted_draft_tokens, stats.draft_tokens * 9 / 10);
  EXPECT_EQ(model->sequences(), 0);
}

TEST(SchedulerTest, CancelFreesBlocks) {
  SchedulerHarness harness(/*num_blocks=*/256, {.max_batch_tokens = 8});
  RequestSpec spec;
  spec.prompt.assign(50, 5);
  spec.max_new_tokens = 500;
  spec.ignore_eos = true;
  auto sink = std::make_shared<CollectingSink>();
  auto ticket = harness.scheduler().Submit(spec, sink);
  ASSERT_TRUE(ticket.ok());
  while (sink->tokens().size() < 2) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_LT(harness.kv().free_blocks(), 256);
  harness.scheduler().Cancel(*ticket);
  ASSERT_TRUE(sink->Wait());
  EXPECT_EQ(sink->reason(), FinishReason::kCancelled);
  EXPECT_EQ(harness.kv().free_blocks(), 256);
}

TEST(SchedulerTest, RejectsBadRequests) {
  SchedulerHarness harness(/*num_blocks=*/64, {.max_queued_requests = 2});
  auto sink = std::make_shared<CollectingSink>();
  const int64_t context = harness.scheduler().max_context_tokens();  // 256: the pool
  EXPECT_EQ(context, 256);
  RequestSpec empty;
  EXPECT_EQ(harness.scheduler().Submit(empty, sink).status().code(),
            absl::StatusCode::kInvalidArgument);
  RequestSpec too_long;
  too_long.prompt.assign(context, 1);
  EXPECT_EQ(harness.scheduler().Submit(too_long, sink).status().code(),
            absl::StatusCode::kInvalidArgument);
  RequestSpec zero_new;
  zero_new.prompt = {1, 2};
  zero_new.max_new_tokens = 0;
  EXPECT_EQ(harness.scheduler().Submit(zero_new, sink).status().code(),
            absl::StatusCode::kInvalidArgument);
  RequestSpec over_limit;
  over_limit.prompt = {1, 2};
  over_limit.max_new_tokens = static_cast<int>(context);
  EXPECT_EQ(harness.scheduler().Submit(over_limit, sink).status().code(),
            absl::StatusCode::kInvalidArgument);
  RequestSpec bad_id;
  bad_id.prompt = {1, 768};
  EXPECT_EQ(harness.scheduler().Submit(bad_id, sink).status().code(),
            absl::StatusCode::kInvalidArgument);
  for (const int top : {-1, kMaxTopLogprobs + 1}) {
    RequestSpec too_many;
    too_many.prompt = {1};
    too_many.logprobs = true;
    too_many.top_logprobs = top;
    const absl::Status refused = harness.scheduler().Submit(too_many, sink).status();
    EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(refused.message().find("top_logprobs"), std::string::npos) << refused;
  }
  RequestSpec stop_without_tokenizer;
  stop_without_tokenizer.prompt = {1};
  stop_without_tokenizer.stop = {"x"};
  EXPECT_EQ(harness.scheduler().Submit(stop_without_tokenizer, sink).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(SchedulerTest, QueueLimitGivesResourceExhausted) {
  // One running request at a time, two may wait: the fourth of a burst is refused.
  SchedulerHarness harness(/*num_blocks=*/64,
                           {.max_batch_tokens = 4, .max_running = 1, .max_queued_requests = 2});
  RequestSpec spec;
  spec.prompt.assign(30, 9);
  spec.max_new_tokens = 40;
  spec.ignore_eos = true;
  std::vector<std::shared_ptr<CollectingSink>> sinks;
  int refused = 0;
  for (int i = 0; i < 6; ++i) {
    sinks.push_back(std::make_shared<CollectingSink>());
    auto ticket = harness.scheduler().Submit(spec, sinks.back());
    if (!ticket.ok()) {
      EXPECT_EQ(ticket.status().code(), absl::StatusCode::kResourceExhausted);
      ++refused;
      sinks.pop_back();
    }
  }
  EXPECT_GE(refused, 3);
  for (auto& sink : sinks) ASSERT_TRUE(sink->Wait());
}

TEST(SchedulerTest, DrainFinishesInFlightRequests) {
  SchedulerHarness harness(/*num_blocks=*/64, {});
  RequestSpec spec;
  spec.prompt = {4, 5, 6};
  spec.max_new_tokens = 10;
  spec.ignore_eos = true;
  auto sink = std::make_shared<CollectingSink>();
  ASSERT_TRUE(harness.scheduler().Submit(spec, sink).ok());
  EXPECT_TRUE(harness.scheduler().Drain(absl::Seconds(60)));
  // The last tokens and the finish go out (the outbox) before Drain says the server is idle.
  EXPECT_EQ(sink->reason(), FinishReason::kLength);
  EXPECT_EQ(sink->tokens().size(), 10u);
  EXPECT_EQ(harness.scheduler().Submit(spec, sink).status().code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace strata
