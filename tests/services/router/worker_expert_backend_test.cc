// WorkerExpertBackend, the router's expert backend, over in-process fake workers
// (tests/testing/fake_expert_connection.h) that run their experts on the CPU: how it splits a
// layer between the workers, and how it reroutes a layer when a worker fails during it, is
// gone, answers late, or comes back. The reference is the same experts run in this process
// on a CpuExpertBackend.
#include "services/router/worker_expert_backend.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "common/backend/cpu/cpu_expert_backend.h"
#include "common/backend/cpu/cpu_router_backend.h"
#include "common/engine/forward_pass.h"
#include "common/model/model_weights.h"
#include "gtest/gtest.h"
#include "tests/testing/fake_expert_connection.h"

namespace strata {
namespace {

using ::strata::testing::FakeExpertConnection;

const std::string kModel = std::string(STRATA_TEST_DATA_DIR) + "/oracles/qwen3_moe";

// One MoE layer's input as the forward pass hands it to the expert backend.
struct LayerInput {
  int layer = 0;
  Tensor x;
  RoutingTable routing;
};

Tensor Copy(const Tensor& t) {
  Tensor copy = Tensor::Host(t.rows(), t.cols());
  std::copy(t.data(), t.data() + t.size(), copy.data());
  return copy;
}

// An ExpertBackend that runs `inner` and keeps a copy of every layer's input.
class RecordingExperts : public ExpertBackend {
 public:
  explicit RecordingExperts(ExpertBackend& inner) : inner_(inner) {}
  absl::Status RunExperts(int layer, const Tensor& x, const RoutingTable& routing,
                          Tensor& out) override {
    inputs.push_back({layer, Copy(x), routing});
    return inner_.RunExperts(layer, x, routing, out);
  }
  std::vector<LayerInput> inputs;

 private:
  ExpertBackend& inner_;
};

// `got` equals `want` within float rounding: summing the same terms in another order.
::testing::AssertionResult Near(const Tensor& got, const Tensor& want) {
  if (got.rows() != want.rows() || got.cols() != want.cols()) {
    return ::testing::AssertionFailure()
           << "shape [" << got.rows() << ", " << got.cols() << "], want [" << want.rows() << ", "
           << want.cols() << "]";
  }
  float scale = 0.0f, worst = 0.0f;
  for (int64_t i = 0; i < want.size(); ++i) {
    scale = std::max(scale, std::abs(want.data()[i]));
    worst = std::max(worst, std::abs(got.data()[i] - want.data()[i]));
  }
  if (scale == 0.0f) return ::testing::AssertionFailure() << "the reference is all zeros";
  if (!(worst <= 1e-5f * scale)) {
    return ::testing::AssertionFailure()
           << "differs by up to " << worst << " (values up to " << scale << ")";
  }
  return ::testing::AssertionSuccess();
}

std::vector<float> Values(const Tensor& t) {
  return std::vector<float>(t.data(), t.data() + t.size());
}

using Workers = std::vector<std::shared_ptr<FakeExpertConnection>>;

class WorkerExpertBackendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto model = LoadModel(kModel);
    ASSERT_TRUE(model.ok()) << model.status();
    model_ = *std::move(model);
    source_ = std::make_unique<ModelExpertSource>(model_->weights);
    local_ = std::make_unique<CpuExpertBackend>(config(), *source_, pool_);
    ASSERT_EQ(config().num_experts, 16);
    ASSERT_EQ(config().num_layers, 3);
    for (int layer = 0; layer < config().num_layers; ++layer) {
      ASSERT_TRUE(config().layer_is_moe[layer]);
    }
  }

  const ModelConfig& config() const { return model_->config; }

  std::shared_ptr<FakeExpertConnection> Worker() {
    return std::make_shared<FakeExpertConnection>(config(), *source_, pool_);
  }
  Workers MakeWorkers(int n) {
    Workers workers;
    for (int w = 0; w < n; ++w) workers.push_back(Worker());
    return workers;
  }

  // A backend with the experts split evenly between `workers` (contiguous ranges: with 3
  // workers, experts 0-5, 6-10 and 11-15), each connected.
  std::unique_ptr<WorkerExpertBackend> Backend(const Workers& workers,
                                               absl::Duration timeout = absl::Seconds(10)) {
    const int n = static_cast<int>(workers.size());
    auto backend = std::make_unique<WorkerExpertBackend>(
        config(), PlacementPlan::Contiguous(config().num_layers, config().num_experts, n),
        WorkerExpertOptions{.timeout = timeout});
    for (int w = 0; w < n; ++w) backend->SetConnection(w, workers[w]);
    return backend;
  }

  // A forward pass over `ids` (one sequence, a prefill) with `experts`: its logits.
  Tensor Forward(ExpertBackend& experts, const std::vector<int32_t>& ids) {
    const ModelConfig& c = config();
    const int n = static_cast<int>(ids.size());
    auto kv = PagedKvCache::Create({.cache = {.block_size = 32, .prefix_caching = false},
                                    .num_blocks = (n + 31) / 32,
                                    .num_layers = c.num_layers,
                                    .num_kv_heads = c.num_kv_heads,
                                    .head_dim = c.head_dim});
    EXPECT_TRUE(kv.ok()) << kv.status();
    if (!kv.ok()) return Tensor();
    BatchLayout batch;
    batch.sequence.assign(n, kv->AddSequence());
    for (int t = 0; t < n; ++t) batch.position.push_back(t);
    EXPECT_TRUE(kv->Reserve(batch.sequence[0], n).ok());
    std::vector<int64_t> rows(n);
    for (int t = 0; t < n; ++t) rows[t] = t;
    CpuRouterBackend router(*model_, pool_);
    ForwardPass pass(c, router, experts, {});
    Tensor logits;
    const absl::Status status = pass.Run(ids, batch, *kv, rows, logits);
    EXPECT_TRUE(status.ok()) << status;
    return logits;
  }

  std::vector<int32_t> RandomIds(int n, uint32_t seed) const {
    std::mt19937 rng(seed);
    std::vector<int32_t> ids(n);
    for (int32_t& id : ids) id = static_cast<int32_t>(rng() % config().vocab_size);
    return ids;
  }

  // Every MoE layer's input, in layer order, of a forward pass over `tokens` random tokens
  // with local experts: real hidden states and the real gate's routing.
  std::vector<LayerInput> LayerInputs(int tokens, uint32_t seed = 1) {
    RecordingExperts recorder(*local_);
    Forward(recorder, RandomIds(tokens, seed));
    EXPECT_EQ(recorder.inputs.size(), static_cast<size_t>(config().num_layers));
    return std::move(recorder.inputs);
  }

  // The reference: every routed expert of the layer run by one local backend.
  Tensor Local(const LayerInput& in) {
    Tensor out;
    EXPECT_TRUE(local_->RunExperts(in.layer, in.x, in.routing, out).ok());
    return out;
  }

  // The same experts summed as the router does with `owner` as the placement: each worker's
  // share run on its own over the rows the router sends that worker (the tokens with a slot of
  // its experts, in token order), the shares added in worker order into zeros.
  Tensor LocalByOwner(const LayerInput& in, const std::vector<int>& owner, int workers) {
    Tensor sum = Tensor::Host(in.x.rows(), in.x.cols());
    for (int w = 0; w < workers; ++w) {
      std::vector<int64_t> rows;
      RoutingTable mine;
      mine.top_k = in.routing.top_k;
      for (int64_t t = 0; t < in.routing.tokens; ++t) {
        bool any = false;
        for (int j = 0; j < mine.top_k; ++j) {
          const int32_t e = in.routing.expert[t * mine.top_k + j];
          any = any || (e >= 0 && owner[e] == w);
        }
        if (!any) continue;
        rows.push_back(t);
        for (int j = 0; j < mine.top_k; ++j) {
          const int32_t e = in.routing.expert[t * mine.top_k + j];
          const bool own = e >= 0 && owner[e] == w;
          mine.expert.push_back(own ? e : -1);
          mine.weight.push_back(own ? in.routing.weight[t * mine.top_k + j] : 0.0f);
        }
      }
      if (rows.empty()) continue;
      mine.tokens = static_cast<int64_t>(rows.size());
      Tensor x = Tensor::Host(mine.tokens, in.x.cols());
      for (size_t r = 0; r < rows.size(); ++r) {
        std::copy(in.x.row(rows[r]), in.x.row(rows[r]) + in.x.cols(), x.row(r));
      }
      Tensor partial;
      EXPECT_TRUE(local_->RunExperts(in.layer, x, mine, partial).ok());
      for (size_t r = 0; r < rows.size(); ++r) {
        for (int64_t i = 0; i < x.cols(); ++i) sum.row(rows[r])[i] += partial.row(r)[i];
      }
    }
    return sum;
  }

  // The distinct experts the layer's routing picks, ascending.
  static std::vector<int32_t> Routed(const LayerInput& in) {
    std::vector<int32_t> experts;
    for (int32_t e : in.routing.expert) {
      if (e >= 0 && std::find(experts.begin(), experts.end(), e) == experts.end()) {
        experts.push_back(e);
      }
    }
    std::sort(experts.begin(), experts.end());
    return experts;
  }

  // Of those, the ones worker `w` owns in the plan.
  static std::vector<int32_t> RoutedOwnedBy(const LayerInput& in, const WorkerExpertBackend& b,
                                            int w) {
    std::vector<int32_t> experts;
    for (int32_t e : Routed(in)) {
      if (b.placement().owner[in.layer][e] == w) experts.push_back(e);
    }
    return experts;
  }

  // Where each worker's request log stands now, for Since.
  static std::vector<size_t> Marks(const Workers& workers) {
    std::vector<size_t> marks;
    for (const auto& worker : workers) marks.push_back(worker->accepted().size());
    return marks;
  }
  // The experts of each request `worker` accepted since `mark`, oldest first.
  static std::vector<std::vector<int32_t>> Since(const FakeExpertConnection& worker, size_t mark) {
    std::vector<std::vector<int32_t>> requests;
    for (size_t i = mark; i < worker.accepted().size(); ++i) {
      requests.push_back(worker.accepted()[i].experts);
    }
    return requests;
  }
  // What worker `w` of the plan should be sent when it is there: nothing, or one request with
  // the routed experts it owns.
  static std::vector<std::vector<int32_t>> OwnShare(const LayerInput& in,
                                                    const WorkerExpertBackend& b, int w) {
    std::vector<int32_t> experts = RoutedOwnedBy(in, b, w);
    if (experts.empty()) return {};
    return {experts};
  }

  // Every channel in step: nothing misused, every answer collected by the exchange it
  // belongs to (but those of `late`, a worker that answered late), nothing left unreceived on
  // a live worker.
  static void ExpectInStep(const Workers& workers, int late = -1) {
    for (size_t w = 0; w < workers.size(); ++w) {
      EXPECT_EQ(workers[w]->violation(), "") << "worker " << w;
      if (static_cast<int>(w) != late) {
        EXPECT_EQ(workers[w]->received_behind(), 0) << "worker " << w;
      }
      if (workers[w]->Alive()) {
        EXPECT_EQ(workers[w]->outstanding(), 0) << "worker " << w;
      }
    }
  }

  ThreadPool pool_{2};
  std::unique_ptr<Model> model_;
  std::unique_ptr<ModelExpertSource> source_;
  std::unique_ptr<CpuExpertBackend> local_;
};

// With every worker alive each one is sent exactly the routed experts it owns, and the sum of
// their answers is the local result. It is bit-identical to each worker's share computed
// locally and added in worker order: a worker's CpuExpertBackend sees the same rows of each
// of its experts as a single local backend would. Against one local backend over all the
// experts it is only equal within rounding, since that adds the experts' outputs of a token
// in expert order in one sum, where the router adds per-worker sums (with one worker, exact).
TEST_F(WorkerExpertBackendTest, AllWorkersAliveMatchLocalExperts) {
  for (int num_workers : {1, 2, 3}) {
    SCOPED_TRACE(::testing::Message() << num_workers << " workers");
    const Workers workers = MakeWorkers(num_workers);
    auto backend = Backend(workers);
    EXPECT_EQ(backend->num_connected(), num_workers);
    std::vector<int> requests(num_workers, 0);
    for (int tokens : {1, 9}) {
      for (const LayerInput& in : LayerInputs(tokens, /*seed=*/tokens)) {
        SCOPED_TRACE(::testing::Message() << "layer " << in.layer << ", " << tokens << " tokens");
        const std::vector<size_t> marks = Marks(workers);
        Tensor out;
        const absl::Status status = backend->RunExperts(in.layer, in.x, in.routing, out);
        ASSERT_TRUE(status.ok()) << status;
        EXPECT_EQ(Values(out),
                  Values(LocalByOwner(in, backend->placement().owner[in.layer], num_workers)));
        EXPECT_TRUE(Near(out, Local(in)));
        if (num_workers == 1) {
          EXPECT_EQ(Values(out), Values(Local(in)));
        }
        for (int w = 0; w < num_workers; ++w) {
          EXPECT_EQ(Since(*workers[w], marks[w]), OwnShare(in, *backend, w)) << "worker " << w;
          requests[w] += static_cast<int>(workers[w]->accepted().size() - marks[w]);
        }
      }
    }
    for (int w = 0; w < num_workers; ++w) {
      EXPECT_GT(requests[w], 0) << "worker " << w << " never had work: a weak test";
      EXPECT_GT(backend->tiers(w).hot_hits, 0u) << "worker " << w;  // from its responses
      EXPECT_TRUE(backend->connected(w));
    }
    EXPECT_EQ(backend->reroutes(), 0);
    ExpectInStep(workers);
  }
}

// A worker whose Send fails in the middle of a run (worker 0, 1 or 2: before, between and
// after the others' requests). The layer runs again on the survivors, who take the dead
// worker's experts on top of their own; the result is still the local one; the reroute is
// counted once; the dead worker shows as not connected. The next layer leaves it out from the
// start: not counted as a reroute, and it is sent nothing.
TEST_F(WorkerExpertBackendTest, AWorkerFailingOnSendIsRoutedAround) {
  const std::vector<LayerInput> inputs = LayerInputs(9);
  for (int dead = 0; dead < 3; ++dead) {
    SCOPED_TRACE(::testing::Message() << "worker " << dead << " dies");
    Workers workers = MakeWorkers(3);
    workers[dead]->fail_send_on = 2;  // layer 1's request
    auto backend = Backend(workers);
    Tensor out;
    ASSERT_TRUE(backend->RunExperts(0, inputs[0].x, inputs[0].routing, out).ok());
    EXPECT_TRUE(Near(out, Local(inputs[0])));
    ASSERT_EQ(workers[dead]->accepted().size(), 1u);

    const std::vector<size_t> marks = Marks(workers);
    const LayerInput& in = inputs[1];
    ASSERT_FALSE(RoutedOwnedBy(in, *backend, dead).empty());
    const absl::Status status = backend->RunExperts(in.layer, in.x, in.routing, out);
    ASSERT_TRUE(status.ok()) << status;
    EXPECT_TRUE(Near(out, Local(in)));
    EXPECT_EQ(backend->reroutes(), 1);
    EXPECT_FALSE(backend->connected(dead));
    EXPECT_EQ(backend->num_connected(), 2);
    EXPECT_EQ(workers[dead]->accepted().size(), 1u);  // the failed request never arrived
    // The survivors' last requests of the layer cover every routed expert between them.
    std::vector<int32_t> covered;
    for (int w = 0; w < 3; ++w) {
      if (w == dead) continue;
      const auto requests = Since(*workers[w], marks[w]);
      ASSERT_FALSE(requests.empty()) << "worker " << w;
      covered.insert(covered.end(), requests.back().begin(), requests.back().end());
    }
    std::sort(covered.begin(), covered.end());
    EXPECT_EQ(covered, Routed(in));
    ExpectInStep(workers);

    const LayerInput& next = inputs[2];
    ASSERT_TRUE(backend->RunExperts(next.layer, next.x, next.routing, out).ok());
    EXPECT_TRUE(Near(out, Local(next)));
    EXPECT_EQ(backend->reroutes(), 1);
    EXPECT_EQ(workers[dead]->accepted().size(), 1u);
    ExpectInStep(workers);
  }
}

// A worker that takes its request and is gone before it answers (killed mid-layer): its
// Receive fails. The answers the others owe for that exchange are still collected (each
// channel stays one response per request), the layer runs again without it, and the result is
// the local one. The gone worker is noticed by its connection, not by waiting out the timeout.
TEST_F(WorkerExpertBackendTest, AWorkerVanishingBeforeItAnswersIsRoutedAround) {
  const std::vector<LayerInput> inputs = LayerInputs(9);
  for (int dead = 0; dead < 3; ++dead) {
    SCOPED_TRACE(::testing::Message() << "worker " << dead << " dies");
    Workers workers = MakeWorkers(3);
    workers[dead]->vanish_on = 2;  // layer 1's request
    auto backend = Backend(workers, /*timeout=*/absl::Seconds(30));
    Tensor out;
    ASSERT_TRUE(backend->RunExperts(0, inputs[0].x, inputs[0].routing, out).ok());
    EXPECT_TRUE(backend->connected(dead));

    const LayerInput& in = inputs[1];
    ASSERT_FALSE(RoutedOwnedBy(in, *backend, dead).empty());
    const absl::Time start = absl::Now();
    const absl::Status status = backend->RunExperts(in.layer, in.x, in.routing, out);
    EXPECT_LT(absl::Now() - start, absl::Seconds(5));
    ASSERT_TRUE(status.ok()) << status;
    EXPECT_TRUE(Near(out, Local(in)));
    EXPECT_EQ(backend->reroutes(), 1);
    EXPECT_FALSE(backend->connected(dead));
    EXPECT_EQ(backend->num_connected(), 2);
    EXPECT_EQ(workers[dead]->accepted().size(), 2u);  // it took the request, then vanished
    ExpectInStep(workers);

    const LayerInput& next = inputs[2];
    ASSERT_TRUE(backend->RunExperts(next.layer, next.x, next.routing, out).ok());
    EXPECT_TRUE(Near(out, Local(next)));
    EXPECT_EQ(backend->reroutes(), 1);
    EXPECT_EQ(workers[dead]->accepted().size(), 2u);
    ExpectInStep(workers);
  }
}

// A slow worker, still alive: the wait for its answer times out and the layer runs again
// without it. It stays connected and gets its experts in the next layer, where its late
// answer to the abandoned exchange comes first and is skipped.
TEST_F(WorkerExpertBackendTest, ALateAnswerIsRoutedAroundThenSkipped) {
  const std::vector<LayerInput> inputs = LayerInputs(9);
  Workers workers = MakeWorkers(3);
  workers[2]->late_on = 1;
  const absl::Duration timeout = absl::Milliseconds(100);
  auto backend = Backend(workers, timeout);
  const LayerInput& in = inputs[0];
  ASSERT_FALSE(RoutedOwnedBy(in, *backend, 2).empty());
  Tensor out;
  const absl::Time start = absl::Now();
  absl::Status status = backend->RunExperts(in.layer, in.x, in.routing, out);
  EXPECT_GE(absl::Now() - start, timeout);  // it waited for the late answer, the timeout given
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_TRUE(Near(out, Local(in)));
  EXPECT_EQ(backend->reroutes(), 1);
  EXPECT_TRUE(backend->connected(2));
  EXPECT_EQ(workers[2]->outstanding(), 1);  // the late answer, still in its channel

  const LayerInput& next = inputs[1];
  const std::vector<size_t> marks = Marks(workers);
  status = backend->RunExperts(next.layer, next.x, next.routing, out);
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_TRUE(Near(out, Local(next)));
  EXPECT_EQ(Values(out), Values(LocalByOwner(next, backend->placement().owner[next.layer], 3)));
  EXPECT_EQ(backend->reroutes(), 1);
  for (int w = 0; w < 3; ++w) {
    EXPECT_EQ(Since(*workers[w], marks[w]), OwnShare(next, *backend, w)) << "worker " << w;
  }
  EXPECT_EQ(workers[2]->received_behind(), 1);  // the late answer, skipped
  ExpectInStep(workers, /*late=*/2);
}

// Without a worker the layer cannot run: UNAVAILABLE, at once, whether none was ever
// connected, every one failed during the layer, or every one is gone before it.
TEST_F(WorkerExpertBackendTest, NoWorkerLeftIsUnavailableWithoutHanging) {
  const std::vector<LayerInput> inputs = LayerInputs(9);
  const LayerInput& in = inputs[0];
  Tensor out;
  {
    WorkerExpertBackend none(
        config(), PlacementPlan::Contiguous(config().num_layers, config().num_experts, 2),
        WorkerExpertOptions{.timeout = absl::Seconds(30)});
    const absl::Status status = none.RunExperts(in.layer, in.x, in.routing, out);
    EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
    EXPECT_EQ(none.num_connected(), 0);
  }
  Workers workers = MakeWorkers(3);
  workers[0]->fail_send_on = 1;
  workers[1]->vanish_on = 1;
  workers[2]->vanish_on = 1;
  auto backend = Backend(workers, /*timeout=*/absl::Seconds(30));
  for (int w = 0; w < 3; ++w) ASSERT_FALSE(RoutedOwnedBy(in, *backend, w).empty());
  absl::Time start = absl::Now();
  absl::Status status = backend->RunExperts(in.layer, in.x, in.routing, out);
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_NE(status.message().find("expert worker"), std::string::npos) << status;
  EXPECT_EQ(backend->num_connected(), 0);
  EXPECT_GE(backend->reroutes(), 1);
  ExpectInStep(workers);

  const std::vector<size_t> marks = Marks(workers);
  start = absl::Now();
  status = backend->RunExperts(inputs[1].layer, inputs[1].x, inputs[1].routing, out);
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_EQ(Marks(workers), marks);  // nobody was sent anything
}

// A worker that is gone before a layer (killed between steps) is left out of it, and a new
// connection for it (the restarted worker registering again) takes its experts back: from the
// next layer on each worker is sent only its own experts again.
TEST_F(WorkerExpertBackendTest, ARestartedWorkerTakesItsExpertsBack) {
  const std::vector<LayerInput> inputs = LayerInputs(9);
  Workers workers = MakeWorkers(3);
  auto backend = Backend(workers);
  workers[1]->Kill();
  EXPECT_FALSE(backend->connected(1));
  const LayerInput& in = inputs[0];
  ASSERT_FALSE(RoutedOwnedBy(in, *backend, 1).empty());
  Tensor out;
  ASSERT_TRUE(backend->RunExperts(in.layer, in.x, in.routing, out).ok());
  EXPECT_TRUE(Near(out, Local(in)));
  EXPECT_TRUE(workers[1]->accepted().empty());
  EXPECT_EQ(backend->reroutes(), 0);  // nothing ran twice: it was gone before the layer

  workers[1] = Worker();
  backend->SetConnection(1, workers[1]);
  EXPECT_TRUE(backend->connected(1));
  EXPECT_EQ(backend->num_connected(), 3);
  for (int layer = 1; layer < 3; ++layer) {
    const LayerInput& next = inputs[layer];
    const std::vector<size_t> marks = Marks(workers);
    ASSERT_TRUE(backend->RunExperts(next.layer, next.x, next.routing, out).ok());
    EXPECT_EQ(Values(out), Values(LocalByOwner(next, backend->placement().owner[next.layer], 3)));
    for (int w = 0; w < 3; ++w) {
      EXPECT_EQ(Since(*workers[w], marks[w]), OwnShare(next, *backend, w))
          << "worker " << w << ", layer " << layer;
    }
  }
  EXPECT_FALSE(workers[1]->accepted().empty());
  ExpectInStep(workers);
}

// The whole model with the workers' backend as its experts, a worker vanishing in the middle of
// the step: the step's logits are still those of the local experts (to rounding), so the
// request that was in flight loses nothing.
TEST_F(WorkerExpertBackendTest, AStepSurvivesAWorkerDyingInIt) {
  const std::vector<int32_t> ids = RandomIds(12, 5);
  const Tensor want = Forward(*local_, ids);
  Workers workers = MakeWorkers(3);
  workers[1]->vanish_on = 2;
  auto backend = Backend(workers);
  const Tensor got = Forward(*backend, ids);
  EXPECT_EQ(backend->reroutes(), 1);
  EXPECT_FALSE(backend->connected(1));
  EXPECT_TRUE(Near(got, want));
  ExpectInStep(workers);
}

}  // namespace
}  // namespace strata
