// WorkerServer (strata-worker) in the test's process, against fakes of strata-expert-store
// and of the router's Coordinator (tests/testing/fake_cluster_services.h), the test playing
// the router's side of each channel: what the worker registers with, the numbers it answers a
// layer with (against the same experts run here on a CpuExpertBackend), the errors it
// answers bad requests with while it goes on serving, its registering again with a router
// that went away and came back, the gRPC transport, and the expert tiers of a memory budget.
#include "services/expert-worker/worker_server.h"

#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "common/backend/cpu/cpu_expert_slots.h"
#include "common/cluster/protocol_version.h"
#include "common/model/model_weights.h"
#include "gtest/gtest.h"
#include "services/expert-store/expert_store.h"
#include "tests/testing/expert_messages.h"
#include "tests/testing/fake_cluster_services.h"
#include "tests/testing/temp_dir.h"

namespace strata {
namespace {

using ::strata::testing::FakeCoordinator;
using ::strata::testing::FakeExpertStore;
using ::strata::testing::HostRunRequest;
using ::strata::testing::TempDir;

const std::string kModel = std::string(STRATA_TEST_DATA_DIR) + "/oracles/qwen3_moe";
constexpr int kMaxTokens = 8;
// Failure guards only: every wait ends as soon as what it waits for happens.
constexpr absl::Duration kGuard = absl::Seconds(30);

// The worker's log lines, which any of its threads may write.
class LogLines {
 public:
  std::function<void(const std::string&)> Sink() {
    return [this](const std::string& line) {
      std::lock_guard<std::mutex> lock(mu_);
      lines_.push_back(line);
      changed_.notify_all();
    };
  }
  // Whether a line containing `text` came within kGuard.
  bool WaitFor(const std::string& text) {
    std::unique_lock<std::mutex> lock(mu_);
    return changed_.wait_for(lock, absl::ToChronoMilliseconds(kGuard), [&] {
      for (const std::string& line : lines_) {
        if (absl::StrContains(line, text)) return true;
      }
      return false;
    });
  }

 private:
  std::mutex mu_;
  std::condition_variable changed_;
  std::vector<std::string> lines_;
};

// One layer's request as the router sends it, with the arrays its view points into.
struct LayerRequest {
  uint64_t step = 0;
  uint32_t layer = 0;
  std::vector<float> hidden;     // [tokens, hidden_size]
  std::vector<int32_t> experts;  // [tokens, top_k]; -1: another worker's
  std::vector<float> weights;
  ExpertRequestView View(uint32_t hidden_size) const {
    return HostRunRequest(step, layer, hidden_size, hidden, experts, weights);
  }
};

// A worker's answer, copied out of the channel.
struct Answer {
  uint64_t step = 0;
  uint32_t layer = 0;
  std::vector<float> partial;
  std::string error;
  TierCounters tiers;
};

// The router's side of a shared-memory channel: a message out, an answer in.
absl::Status SendBytes(ShmChannel& channel, absl::Span<const uint8_t> bytes) {
  absl::StatusOr<absl::Span<uint8_t>> slot = channel.outbound().Reserve(bytes.size(), kGuard);
  if (!slot.ok()) return slot.status();
  std::copy(bytes.begin(), bytes.end(), slot->begin());
  return channel.outbound().Commit(bytes.size());
}
std::vector<uint8_t> Encoded(const ExpertRequestView& request) {
  std::vector<uint8_t> bytes(EncodedSize(request));
  EncodeExpertRequest(request, absl::MakeSpan(bytes));
  return bytes;
}
absl::StatusOr<Answer> Receive(ShmChannel& channel) {
  absl::StatusOr<absl::Span<const uint8_t>> bytes = channel.inbound().Peek(kGuard);
  if (!bytes.ok()) return bytes.status();
  absl::StatusOr<ExpertResponseView> response = DecodeExpertResponse(*bytes);
  if (!response.ok()) return response.status();
  Answer answer{.step = response->step,
                .layer = response->layer,
                .partial = {response->partial.begin(), response->partial.end()},
                .error = std::string(response->error),
                .tiers = response->tiers};
  if (absl::Status popped = channel.inbound().Pop(); !popped.ok()) return popped;
  return answer;
}
absl::StatusOr<Answer> Exchange(ShmChannel& channel, const ExpertRequestView& request) {
  if (absl::Status sent = SendBytes(channel, Encoded(request)); !sent.ok()) return sent;
  return Receive(channel);
}

// The distinct experts of a request's slots.
std::vector<int32_t> Distinct(const std::vector<int32_t>& slots) {
  std::vector<int32_t> experts;
  for (int32_t e : slots) {
    if (e >= 0 && std::find(experts.begin(), experts.end(), e) == experts.end()) {
      experts.push_back(e);
    }
  }
  return experts;
}

// WorkerServer::Run on a thread of its own; stopped and waited for on destruction.
class RunningWorker {
 public:
  explicit RunningWorker(std::unique_ptr<WorkerServer> worker)
      : worker_(std::move(worker)),
        done_(std::async(std::launch::async, [w = worker_.get()] { return w->Run(); })) {}
  ~RunningWorker() {
    worker_->Stop();
    if (done_.valid()) done_.wait();
  }
  // What Run returned, if it returned by itself within kGuard.
  std::optional<absl::Status> Returned() {
    if (!returned_.has_value() &&
        done_.wait_for(absl::ToChronoMilliseconds(kGuard)) == std::future_status::ready) {
      returned_ = done_.get();
    }
    return returned_;
  }

 private:
  std::unique_ptr<WorkerServer> worker_;
  std::future<absl::Status> done_;
  std::optional<absl::Status> returned_;
};

class WorkerServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<Model>> model = LoadModel(kModel);
    ASSERT_TRUE(model.ok()) << model.status();
    model_ = *std::move(model);
    ASSERT_EQ(config().num_experts, 16);
    source_ = std::make_unique<ModelExpertSource>(model_->weights);
    local_ = std::make_unique<CpuExpertBackend>(config(), *source_, pool_);
    // The checkpoint's own file as the store: a real layout, no shared memory.
    ExpertStoreOptions in_place;
    in_place.in_place = true;
    absl::StatusOr<std::unique_ptr<ExpertStore>> store = ExpertStore::MapInPlace(*model_, in_place);
    ASSERT_TRUE(store.ok()) << store.status();
    absl::StatusOr<ClusterToken> token = ClusterToken::FromSecret(std::string(40, 't'));
    ASSERT_TRUE(token.ok()) << token.status();
    token_ = *std::move(token);
    store_ = std::make_unique<FakeExpertStore>((*store)->layout(), token_);
    ASSERT_TRUE(store_->Start(StoreAddress()).ok());
  }

  const ModelConfig& config() const { return model_->config; }
  std::string StoreAddress() const { return "unix:" + dir_.File("store.sock"); }
  std::string RouterAddress() const { return "unix:" + dir_.File("router.sock"); }

  WorkerOptions Options() {
    WorkerOptions options;
    options.model_dir = kModel;
    options.store_address = StoreAddress();
    options.router_address = RouterAddress();
    options.token = token_;
    options.channel_prefix = absl::StrCat("strata-worker-test-", ::getpid());
    options.max_tokens_per_step = kMaxTokens;
    options.num_threads = 2;
    options.log = log_.Sink();
    return options;
  }

  // The router's answer to worker `index` of `workers`: contiguous ranges of each layer's
  // experts (with 2 workers, 0-7 and 8-15).
  v1::RegisterWorkerResponse Owning(int index, int workers) const {
    v1::RegisterWorkerResponse answer;
    answer.set_num_workers(workers);
    for (int layer = 0; layer < config().num_layers; ++layer) {
      v1::ExpertRange* range = answer.add_owned();
      range->set_layer(layer);
      for (int e : OwnedBy(index, workers)) range->add_experts(e);
    }
    return answer;
  }
  std::vector<int> OwnedBy(int index, int workers) const {
    std::vector<int> experts;
    const int per = config().num_experts / workers;
    for (int e = index * per; e < (index + 1) * per; ++e) experts.push_back(e);
    return experts;
  }

  std::unique_ptr<FakeCoordinator> StartRouter(v1::RegisterWorkerResponse answer) {
    auto router = std::make_unique<FakeCoordinator>(config(), kMaxTokens, token_, answer);
    const absl::Status started = router->Start(RouterAddress());
    EXPECT_TRUE(started.ok()) << started;
    return router;
  }

  // A worker created (layout fetched, experts mapped) and running.
  std::unique_ptr<RunningWorker> StartWorker(const WorkerOptions& options) {
    absl::StatusOr<std::unique_ptr<WorkerServer>> worker = WorkerServer::Create(options);
    EXPECT_TRUE(worker.ok()) << worker.status();
    if (!worker.ok()) return nullptr;
    return std::make_unique<RunningWorker>(*std::move(worker));
  }

  // The registration's channel once the worker attached to it.
  ShmChannel* Attached(FakeCoordinator::Registration* registration) {
    if (registration == nullptr || registration->channel == nullptr) return nullptr;
    const absl::Status attached = registration->channel->WaitForPeer(kGuard);
    EXPECT_TRUE(attached.ok()) << attached;
    return attached.ok() ? registration->channel.get() : nullptr;
  }

  // `tokens` random hidden states, each routed to top_k distinct experts drawn from
  // `experts`, with the slots of the others' experts -1 (as the router sends them).
  LayerRequest Random(uint64_t step, uint32_t layer, int tokens, const std::vector<int>& experts,
                      uint32_t seed) const {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> value(-1.0f, 1.0f), weight(0.05f, 0.5f);
    LayerRequest r;
    r.step = step;
    r.layer = layer;
    for (int64_t i = 0; i < tokens * config().hidden_size; ++i) r.hidden.push_back(value(rng));
    for (int t = 0; t < tokens; ++t) {
      std::vector<int> picks = experts;
      std::shuffle(picks.begin(), picks.end(), rng);
      for (int j = 0; j < config().top_k; ++j) {
        const bool other = (t + j) % 3 == 2;
        r.experts.push_back(other ? -1 : picks[j]);
        r.weights.push_back(other ? 0.0f : weight(rng));
      }
    }
    return r;
  }

  // The same experts run here, on the checkpoint as loaded.
  std::vector<float> Reference(const LayerRequest& r) {
    const int64_t tokens = static_cast<int64_t>(r.experts.size()) / config().top_k;
    Tensor x = Tensor::Host(tokens, config().hidden_size);
    std::copy(r.hidden.begin(), r.hidden.end(), x.data());
    RoutingTable routing;
    routing.top_k = config().top_k;
    routing.tokens = tokens;
    routing.expert = r.experts;
    routing.weight = r.weights;
    Tensor out;
    const absl::Status status = local_->RunExperts(static_cast<int>(r.layer), x, routing, out);
    EXPECT_TRUE(status.ok()) << status;
    return std::vector<float>(out.data(), out.data() + out.size());
  }

  uint32_t hidden_size() const { return static_cast<uint32_t>(config().hidden_size); }

  TempDir dir_;
  LogLines log_;
  ThreadPool pool_{2};
  std::unique_ptr<Model> model_;
  std::unique_ptr<ModelExpertSource> source_;
  std::unique_ptr<CpuExpertBackend> local_;
  ClusterToken token_;
  std::unique_ptr<FakeExpertStore> store_;
};

// A CPU worker registers once with what the router needs to know of it, then answers each
// layer with the weighted sum of its experts: the very numbers the same experts give here.
TEST_F(WorkerServerTest, RegistersThenAnswersLayersWithTheExpertsNumbers) {
  auto router = StartRouter(Owning(1, 2));
  WorkerOptions options = Options();
  options.index = 1;
  auto worker = StartWorker(options);
  ASSERT_NE(worker, nullptr);
  FakeCoordinator::Registration* registration = router->WaitForRegistration(1);
  ASSERT_NE(registration, nullptr);
  const v1::RegisterWorkerRequest& sent = registration->request;
  EXPECT_EQ(sent.worker_index(), 1u);
  EXPECT_EQ(sent.protocol_version(), kClusterProtocolVersion);
  EXPECT_EQ(sent.device(), "cpu");
  EXPECT_EQ(sent.pid(), static_cast<uint32_t>(::getpid()));
  EXPECT_NE(sent.incarnation(), 0u);
  EXPECT_EQ(sent.transport(), v1::TRANSPORT_SHARED_MEMORY);
  EXPECT_FALSE(sent.tiered());
  EXPECT_EQ(sent.address(), "");
  EXPECT_EQ(store_->calls(), 1);
  ShmChannel* channel = Attached(registration);
  ASSERT_NE(channel, nullptr);
  EXPECT_TRUE(log_.WaitFor("registered as worker 1 of 2, owning 24 (layer, expert) pairs"));

  uint64_t uses = 0;
  for (int tokens : {1, kMaxTokens}) {
    for (uint32_t layer = 0; layer < 3; ++layer) {
      SCOPED_TRACE(::testing::Message() << tokens << " tokens, layer " << layer);
      const LayerRequest request = Random(10 * layer + tokens, layer, tokens, OwnedBy(1, 2), layer);
      absl::StatusOr<Answer> answer = Exchange(*channel, request.View(hidden_size()));
      ASSERT_TRUE(answer.ok()) << answer.status();
      EXPECT_EQ(answer->error, "");
      EXPECT_EQ(answer->step, request.step);
      EXPECT_EQ(answer->layer, layer);
      EXPECT_EQ(answer->partial, Reference(request));
      // Every expert is resident: each distinct one a request uses is a hot hit.
      uses += Distinct(request.experts).size();
      EXPECT_EQ(answer->tiers.hot_hits, uses);
      EXPECT_EQ(answer->tiers.misses, 0u);
    }
  }
}

// Requests the worker cannot run are each answered with an error that says why (and the step,
// when the header names one), and the worker serves on: a prefetch hint is taken without an
// answer and the next request gets its right numbers.
TEST_F(WorkerServerTest, AnswersBadRequestsWithAReasonAndServesOn) {
  auto router = StartRouter(Owning(0, 1));
  auto worker = StartWorker(Options());
  ASSERT_NE(worker, nullptr);
  ShmChannel* channel = Attached(router->WaitForRegistration(1));
  ASSERT_NE(channel, nullptr);
  const LayerRequest good = Random(7, 1, 3, OwnedBy(0, 1), 1);

  struct Bad {
    std::string what;
    std::vector<uint8_t> bytes;
    uint64_t step;  // in the answer
    std::string error;
  };
  std::vector<Bad> bads;
  std::vector<uint8_t> truncated = Encoded(good.View(hidden_size()));
  truncated.resize(truncated.size() - 4);
  bads.push_back({"truncated", truncated, 7, "size does not match its header"});
  bads.push_back({"not a request", std::vector<uint8_t>(256, 0xab), 0, "bad magic"});
  LayerRequest r = good;
  r.experts[0] = 99;
  bads.push_back({"expert id", Encoded(r.View(hidden_size())), 7, "expert 99 out of range"});
  r = good;
  r.layer = 7;
  bads.push_back({"layer", Encoded(r.View(hidden_size())), 7, "layer 7 has no experts"});
  r = good;
  r.hidden.resize(r.hidden.size() / 2);
  bads.push_back({"hidden size", Encoded(r.View(hidden_size() / 2)), 7,
                  absl::StrCat("hidden size ", hidden_size() / 2, " does not match")});
  ExpertRequestView device_run = good.View(hidden_size());
  device_run.kind = ExpertMessageKind::kDeviceRun;
  bads.push_back({"device run", Encoded(device_run), 7, "no CUDA IPC buffers"});
  for (const Bad& bad : bads) {
    SCOPED_TRACE(bad.what);
    ASSERT_TRUE(SendBytes(*channel, bad.bytes).ok());
    absl::StatusOr<Answer> answer = Receive(*channel);
    ASSERT_TRUE(answer.ok()) << answer.status();
    EXPECT_TRUE(absl::StrContains(answer->error, bad.error)) << answer->error;
    EXPECT_EQ(answer->step, bad.step);
    EXPECT_TRUE(answer->partial.empty());
  }

  ExpertRequestView prefetch;
  prefetch.kind = ExpertMessageKind::kPrefetch;
  prefetch.layer = 2;
  const std::vector<int32_t> predicted = {3, 4};
  prefetch.experts = predicted;
  prefetch.top_k = static_cast<uint32_t>(predicted.size());
  ASSERT_TRUE(SendBytes(*channel, Encoded(prefetch)).ok());
  absl::StatusOr<Answer> answer = Exchange(*channel, good.View(hidden_size()));
  ASSERT_TRUE(answer.ok()) << answer.status();
  EXPECT_EQ(answer->error, "");
  EXPECT_EQ(answer->step, good.step);
  EXPECT_EQ(answer->partial, Reference(good));
}

// The router goes away (its channel closed, its listener gone) and comes back at the same
// address: the worker registers again, as a new incarnation, and serves the new router.
TEST_F(WorkerServerTest, RegistersAgainWithARouterThatCameBack) {
  auto router = StartRouter(Owning(0, 1));
  auto worker = StartWorker(Options());
  ASSERT_NE(worker, nullptr);
  FakeCoordinator::Registration* first = router->WaitForRegistration(1);
  ShmChannel* channel = Attached(first);
  ASSERT_NE(channel, nullptr);
  const LayerRequest request = Random(1, 0, 4, OwnedBy(0, 1), 3);
  ASSERT_TRUE(Exchange(*channel, request.View(hidden_size())).ok());
  const v1::RegisterWorkerRequest before = first->request;
  router.reset();

  router = StartRouter(Owning(0, 1));
  FakeCoordinator::Registration* again = router->WaitForRegistration(1);
  ASSERT_NE(again, nullptr);
  EXPECT_EQ(again->request.worker_index(), before.worker_index());
  EXPECT_EQ(again->request.pid(), before.pid());
  EXPECT_EQ(again->request.incarnation(), before.incarnation() + 1);
  channel = Attached(again);
  ASSERT_NE(channel, nullptr);
  EXPECT_TRUE(log_.WaitFor("registered again as worker 0 of 1"));
  absl::StatusOr<Answer> answer = Exchange(*channel, request.View(hidden_size()));
  ASSERT_TRUE(answer.ok()) << answer.status();
  EXPECT_EQ(answer->partial, Reference(request));
}

// A router that refuses the worker for a reason retrying cannot fix (another build's protocol)
// ends Run with that reason; a store that refuses the token ends Create.
TEST_F(WorkerServerTest, RefusalsEndTheWorkerWithTheReason) {
  auto router = StartRouter(Owning(0, 1));
  router->Refuse(absl::FailedPreconditionError("run the router and its workers from one build"));
  auto worker = StartWorker(Options());
  ASSERT_NE(worker, nullptr);
  std::optional<absl::Status> returned = worker->Returned();
  ASSERT_TRUE(returned.has_value()) << "Run went on after the refusal";
  EXPECT_TRUE(absl::IsFailedPrecondition(*returned)) << *returned;
  EXPECT_TRUE(absl::StrContains(returned->message(), "from one build")) << *returned;
  EXPECT_EQ(router->refused(), 1);

  WorkerOptions options = Options();
  absl::StatusOr<ClusterToken> other = ClusterToken::FromSecret(std::string(40, 'o'));
  ASSERT_TRUE(other.ok());
  options.token = *other;
  absl::StatusOr<std::unique_ptr<WorkerServer>> refused = WorkerServer::Create(options);
  EXPECT_TRUE(absl::IsFailedPrecondition(refused.status())) << refused.status();
  EXPECT_TRUE(absl::StrContains(refused.status().message(), "refused this worker"))
      << refused.status();
}

// Over gRPC (a router on another host) the worker registers its ExpertWorker address and
// answers each request of a stream, a malformed one with an error, the stream going on; a
// stream without the cluster token is refused.
TEST_F(WorkerServerTest, OverGrpcAnswersItsExpertWorkerStream) {
  auto router = StartRouter(Owning(0, 1));
  WorkerOptions options = Options();
  options.transport = v1::TRANSPORT_GRPC;
  options.listen = "unix:" + dir_.File("worker.sock");
  auto worker = StartWorker(options);
  ASSERT_NE(worker, nullptr);
  FakeCoordinator::Registration* registration = router->WaitForRegistration(1);
  ASSERT_NE(registration, nullptr);
  EXPECT_EQ(registration->request.transport(), v1::TRANSPORT_GRPC);
  EXPECT_EQ(registration->request.address(), options.listen);

  auto stub = v1::ExpertWorker::NewStub(
      grpc::CreateChannel(options.listen, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + kGuard));
  token_.Attach(context);
  auto stream = stub->Exchange(&context);
  const LayerRequest request = Random(5, 2, 6, OwnedBy(0, 1), 4);
  v1::ExpertRequest message;
  message.set_step(request.step);
  message.set_layer(request.layer);
  message.set_num_tokens(static_cast<uint32_t>(request.experts.size() / config().top_k));
  message.set_top_k(config().top_k);
  message.set_hidden(std::string(reinterpret_cast<const char*>(request.hidden.data()),
                                 request.hidden.size() * sizeof(float)));
  message.mutable_experts()->Add(request.experts.begin(), request.experts.end());
  message.mutable_weights()->Add(request.weights.begin(), request.weights.end());
  v1::ExpertRequest malformed = message;
  malformed.mutable_weights()->RemoveLast();
  for (const v1::ExpertRequest* sent : {&message, &malformed, &message}) {
    v1::ExpertResponse response;
    ASSERT_TRUE(stream->Write(*sent));
    ASSERT_TRUE(stream->Read(&response));
    EXPECT_EQ(response.step(), request.step);
    if (sent == &malformed) {
      EXPECT_EQ(response.error(), "malformed expert request");
      continue;
    }
    EXPECT_EQ(response.error(), "");
    const std::string& bytes = response.partial();
    std::vector<float> partial(bytes.size() / sizeof(float));
    std::memcpy(partial.data(), bytes.data(), partial.size() * sizeof(float));
    EXPECT_EQ(partial, Reference(request));
  }
  ASSERT_TRUE(stream->WritesDone());
  EXPECT_TRUE(stream->Finish().ok());

  grpc::ClientContext bare;
  bare.set_deadline(absl::ToChronoTime(absl::Now() + kGuard));
  auto refused = stub->Exchange(&bare);
  v1::ExpertResponse response;
  refused->Write(message);  // may fail already: the call is refused as it arrives
  EXPECT_FALSE(refused->Read(&response));
  EXPECT_EQ(refused->Finish().error_code(), grpc::StatusCode::UNAUTHENTICATED);
}

// Under a memory budget the worker says it is tiered, keeps resident the hot set the router's
// calibration and hot ratio pick, copies the misses into warm slots, and still answers with
// the same numbers.
TEST_F(WorkerServerTest, UnderABudgetTheTiersKeepTheNumbers) {
  v1::RegisterWorkerResponse answer = Owning(0, 1);
  answer.set_hot_ratio(0.5f);
  const std::vector<int> busy = {0, 1, 2, 3, 4, 5, 6, 7}, quiet = {8, 9, 10, 11, 12, 13, 14, 15};
  for (int layer = 0; layer < config().num_layers; ++layer) {
    for (int e : busy) {
      v1::ExpertCount* count = answer.add_calibration();
      count->set_layer(layer);
      count->set_expert(e);
      count->set_count(100 - e);
    }
  }
  auto router = StartRouter(answer);
  WorkerOptions options = Options();
  const FfnWeights& sample = model_->weights.layers[0].experts[0];
  const uint64_t slot_bytes =
      CpuExpertSlotBytes(config(), sample.gate.dtype, sample.gate_bias.present());
  // Room for every expert; the hot ratio keeps half of them hot.
  options.memory_budget = 64 * slot_bytes;
  auto worker = StartWorker(options);
  ASSERT_NE(worker, nullptr);
  FakeCoordinator::Registration* registration = router->WaitForRegistration(1);
  ShmChannel* channel = Attached(registration);
  ASSERT_NE(channel, nullptr);
  EXPECT_TRUE(registration->request.tiered());
  EXPECT_TRUE(log_.WaitFor("hot set: 24 expert(s) resident"));

  const LayerRequest hot = Random(1, 1, kMaxTokens, busy, 5);
  const LayerRequest cold = Random(2, 1, kMaxTokens, quiet, 6);
  const uint64_t cold_experts = Distinct(cold.experts).size();
  absl::StatusOr<Answer> answer_hot = Exchange(*channel, hot.View(hidden_size()));
  ASSERT_TRUE(answer_hot.ok()) << answer_hot.status();
  EXPECT_EQ(answer_hot->partial, Reference(hot));
  EXPECT_EQ(answer_hot->tiers.hot_slots, 24u);
  EXPECT_EQ(answer_hot->tiers.slot_bytes, slot_bytes);
  EXPECT_EQ(answer_hot->tiers.hot_hits, Distinct(hot.experts).size());
  EXPECT_EQ(answer_hot->tiers.misses, 0u);
  for (int pass = 0; pass < 2; ++pass) {
    SCOPED_TRACE(pass == 0 ? "cold experts, copied in" : "the same experts, now warm");
    absl::StatusOr<Answer> answer_cold = Exchange(*channel, cold.View(hidden_size()));
    ASSERT_TRUE(answer_cold.ok()) << answer_cold.status();
    EXPECT_EQ(answer_cold->error, "");
    EXPECT_EQ(answer_cold->partial, Reference(cold));
    EXPECT_EQ(answer_cold->tiers.misses, cold_experts);
    EXPECT_EQ(answer_cold->tiers.warm_hits, pass * cold_experts);
  }
}

}  // namespace
}  // namespace strata
