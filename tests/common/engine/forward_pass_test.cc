// The forward pass's expert prediction: which layers' experts are hinted to the expert backend,
// in which order, with and without a lookahead, on the CPU reference; hints leave the logits
// unchanged.
#include "common/engine/forward_pass.h"

#include <string>
#include <utility>
#include <vector>

#include "common/engine/model_stack.h"
#include "gtest/gtest.h"

namespace strata {
namespace {

// Runs the stack's own experts and records every prefetch hint (layer, experts).
class HintRecorder : public ExpertBackend {
 public:
  explicit HintRecorder(ExpertBackend& experts) : experts_(experts) {}
  absl::Status RunExperts(int layer, const Tensor& x, const RoutingTable& routing,
                          Tensor& out) override {
    return experts_.RunExperts(layer, x, routing, out);
  }
  void Prefetch(int layer, const RoutingTable& predicted) override {
    hints.push_back({layer, predicted.expert});
  }
  bool wants_prefetch() const override { return true; }

  std::vector<std::pair<int, std::vector<int32_t>>> hints;

 private:
  ExpertBackend& experts_;
};

class ForwardPassTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ModelStackOptions options;
    options.num_threads = 1;
    auto stack =
        ModelStack::Create(std::string(STRATA_TEST_DATA_DIR) + "/oracles/qwen3_moe", options);
    ASSERT_TRUE(stack.ok()) << stack.status();
    stack_ = *std::move(stack);
  }

  // A 5-token prompt through one pass with `lookahead`: the hinted layers in order, and the
  // last token's logits.
  std::vector<int> Run(int lookahead, Tensor& logits, HintRecorder& recorder) {
    ForwardOptions options;
    options.predict_next_experts = true;
    options.prefetch_lookahead = lookahead;
    ForwardPass pass(stack_->config(), stack_->router(), recorder, options);
    PagedKvCache& kv = stack_->kv();
    const PagedKvCache::SequenceId seq = kv.AddSequence();
    const std::vector<int32_t> ids = {3, 1, 4, 1, 5};
    EXPECT_TRUE(kv.Reserve(seq, ids.size()).ok());
    BatchLayout batch;
    for (size_t i = 0; i < ids.size(); ++i) {
      batch.sequence.push_back(seq);
      batch.position.push_back(static_cast<int64_t>(i));
    }
    const std::vector<int64_t> rows = {static_cast<int64_t>(ids.size()) - 1};
    EXPECT_TRUE(pass.Run(ids, batch, kv, rows, logits).ok());
    kv.Release(seq);
    std::vector<int> layers;
    for (const auto& [layer, experts] : recorder.hints) {
      layers.push_back(layer);
      EXPECT_EQ(experts.size(), ids.size() * stack_->config().top_k) << "layer " << layer;
      for (int32_t e : experts) EXPECT_TRUE(e >= 0 && e < stack_->config().num_experts);
    }
    return layers;
  }

  std::unique_ptr<ModelStack> stack_;
};

TEST_F(ForwardPassTest, TheNextLayerIsHintedAfterEachLayer) {
  ASSERT_EQ(stack_->config().num_layers, 3);
  HintRecorder recorder(*stack_->experts());
  Tensor logits;
  EXPECT_EQ(Run(0, logits, recorder), (std::vector<int>{1, 2}));
}

// Layer 2 is hinted first from layer 0's output (two ahead), then again from layer 1's; the
// nearer hint comes last after each layer. The logits are those of a pass without hints.
TEST_F(ForwardPassTest, ALookaheadHintsFurtherLayersOnceFromTheEarliestResidual) {
  HintRecorder plain(*stack_->experts()), ahead(*stack_->experts());
  Tensor without, with;
  Run(0, without, plain);
  EXPECT_EQ(Run(2, with, ahead), (std::vector<int>{2, 1, 2}));
  ASSERT_EQ(with.size(), without.size());
  for (int64_t i = 0; i < with.size(); ++i) ASSERT_EQ(with.data()[i], without.data()[i]);
  // The nearer hints are those of the pass without a lookahead.
  EXPECT_EQ(ahead.hints[1].second, plain.hints[0].second);
  EXPECT_EQ(ahead.hints[2].second, plain.hints[1].second);
}

}  // namespace
}  // namespace strata
