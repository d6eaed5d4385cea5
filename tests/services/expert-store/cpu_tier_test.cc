// strata-expert-store's CPU tier end to end in one process: a ExpertStoreServer on an oracle model,
// a CpuTierClient (the worker's end), and a CpuExpertBackend of this process over the same shared
// memory as the reference.
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <unistd.h>

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/backend/cpu/cpu_expert_backend.h"
#include "common/backend/cpu/cpu_router_backend.h"
#include "common/transport/expert_executor.h"
#include "common/transport/mapped_experts.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/expert-store/expert_store_server.h"
#include "services/expert-worker/cpu_tier_client.h"
#include "strata/v1/cluster.grpc.pb.h"
#include "tests/common/shm/shm_test_util.h"

namespace strata {
namespace {

using shm_test::ForkedChild;
using shm_test::ScopedShmName;

const std::string kModel = std::string(STRATA_TEST_DATA_DIR) + "/oracles/qwen3_moe";
constexpr int kMaxTokens = 16;

// The cluster token the test's expert store requires (on TCP it must require one).
const ClusterToken& Token() {
  static const ClusterToken* token =
      new ClusterToken(*ClusterToken::FromSecret(std::string(48, 'k')));
  return *token;
}

std::unique_ptr<ExpertStoreServer> StartStore() {
  static int counter = 0;
  ExpertStoreServerOptions options;
  options.token = Token();
  options.model_dir = kModel;
  options.store.segment_prefix = absl::StrCat("strata_test_cputier_", ::getpid(), "_", counter++);
  options.store.bind_numa = false;
  options.cpu_tier.num_threads = 2;
  auto server = ExpertStoreServer::Start(options);
  EXPECT_TRUE(server.ok()) << server.status();
  return server.ok() ? *std::move(server) : nullptr;
}

// Waits until the store serves `n` channels (threads end asynchronously).
bool WaitForChannels(CpuTierService& tier, int n, absl::Duration timeout = absl::Seconds(5)) {
  const absl::Time deadline = absl::Now() + timeout;
  while (tier.active_channels() != n) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return true;
}

grpc::Status Attach(const std::string& address, const std::string& name, pid_t pid) {
  auto stub =
      v1::ExpertStore::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  Token().Attach(context);
  v1::AttachComputeRequest request;
  request.set_channel_name(name);
  request.set_pid(static_cast<uint32_t>(pid));
  v1::AttachComputeResponse response;
  return stub->AttachCompute(&context, request, &response);
}

// One layer request as a worker owning the odd experts would get it: the real gate's top-k
// of random tokens' embeddings, the even experts' slots -1.
struct Request {
  std::vector<float> hidden;
  std::vector<int32_t> experts;
  std::vector<float> weights;
  ExpertRequestView view;
};

class CpuTierTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = StartStore();
    ASSERT_NE(server_, nullptr);
    auto model = LoadModel(kModel);
    ASSERT_TRUE(model.ok()) << model.status();
    model_ = *std::move(model);
    const ModelConfig& c = model_->config;
    router_ = std::make_unique<CpuRouterBackend>(*model_, pool_);
    auto mapped = MappedExperts::Map(server_->store().layout(), c);
    ASSERT_TRUE(mapped.ok()) << mapped.status();
    local_experts_ = *std::move(mapped);
    local_backend_ = std::make_unique<CpuExpertBackend>(c, *local_experts_, pool_);
    local_ = std::make_unique<ExpertExecutor>(c, *local_backend_);
  }

  std::unique_ptr<CpuTierClient> Connect() {
    const ModelConfig& c = model_->config;
    auto client = CpuTierClient::Connect(server_->address(), "strata_test_cputier_w", kMaxTokens,
                                         c.top_k, static_cast<int>(c.hidden_size), Token());
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? *std::move(client) : nullptr;
  }

  std::unique_ptr<Request> MakeRequest(uint64_t step, int layer, int tokens) {
    const ModelConfig& c = model_->config;
    std::vector<int32_t> ids(tokens);
    for (int32_t& id : ids) id = static_cast<int32_t>(rng_() % c.vocab_size);
    KvPoolOptions kv_options{.cache = {.block_size = kMaxTokens, .prefix_caching = false},
                             .num_blocks = 1,
                             .num_layers = c.num_layers,
                             .num_kv_heads = c.num_kv_heads,
                             .head_dim = c.head_dim};
    PagedKvCache kv = *PagedKvCache::Create(kv_options);
    BatchLayout batch;
    batch.sequence.assign(tokens, kv.AddSequence());
    for (int t = 0; t < tokens; ++t) batch.position.push_back(t);
    EXPECT_TRUE(kv.Reserve(batch.sequence[0], tokens).ok());
    Tensor ffn_input;
    RoutingTable routing;
    EXPECT_TRUE(router_->BeginStep(ids, batch, kv).ok());
    EXPECT_TRUE(router_->PrepareFfn(layer, 1.0f, ffn_input, routing).ok());
    auto r = std::make_unique<Request>();
    r->hidden.assign(ffn_input.data(), ffn_input.data() + ffn_input.size());
    r->experts = routing.expert;
    r->weights = routing.weight;
    for (int32_t& e : r->experts) {
      if (e % 2 == 0) e = -1;
    }
    r->view.step = step;
    r->view.layer = layer;
    r->view.num_tokens = tokens;
    r->view.top_k = c.top_k;
    r->view.hidden_size = c.hidden_size;
    r->view.hidden = r->hidden;
    r->view.experts = r->experts;
    r->view.weights = r->weights;
    return r;
  }

  // The reference: this process's backend on the same request.
  std::vector<float> Local(const Request& r) {
    EXPECT_TRUE(local_->Run(r.view).ok());
    return std::vector<float>(local_->partial().data(),
                              local_->partial().data() + local_->partial().size());
  }

  static std::vector<float> Values(const Tensor& t) {
    return std::vector<float>(t.data(), t.data() + t.size());
  }

  ThreadPool pool_{2};
  std::unique_ptr<ExpertStoreServer> server_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<CpuRouterBackend> router_;
  std::unique_ptr<MappedExperts> local_experts_;
  std::unique_ptr<CpuExpertBackend> local_backend_;
  std::unique_ptr<ExpertExecutor> local_;
  std::mt19937 rng_{7};
};

TEST_F(CpuTierTest, PartialSumsEqualALocalBackend) {
  auto client = Connect();
  ASSERT_NE(client, nullptr);
  EXPECT_TRUE(client->Alive());
  EXPECT_EQ(server_->cpu_tier().active_channels(), 1);
  uint64_t step = 0;
  int nonzero_tokens = 0;
  for (int layer = 0; layer < model_->config.num_layers; ++layer) {
    for (int tokens : {1, 5, kMaxTokens}) {
      auto request = MakeRequest(++step, layer, tokens);
      ASSERT_TRUE(client->Submit(request->view).ok());
      Tensor partial;
      const absl::Status collected = client->Collect(partial, absl::Seconds(30));
      ASSERT_TRUE(collected.ok()) << collected;
      ASSERT_EQ(partial.rows(), tokens);
      ASSERT_EQ(partial.cols(), model_->config.hidden_size);
      // The same code on the same bytes: bit-identical, not merely close.
      EXPECT_EQ(Values(partial), Local(*request)) << "layer " << layer << " tokens " << tokens;
      for (int t = 0; t < tokens; ++t) nonzero_tokens += partial.row(t)[0] != 0.0f;
    }
  }
  EXPECT_GT(nonzero_tokens, 0);  // the odd experts were really run
  EXPECT_EQ(client->outstanding(), 0);
}

TEST_F(CpuTierTest, RequestsOverlapWithTheWorkersOwnWork) {
  auto client = Connect();
  ASSERT_NE(client, nullptr);
  auto a = MakeRequest(1, 0, 3);
  auto b = MakeRequest(2, 1, 7);
  ASSERT_TRUE(client->Submit(a->view).ok());
  ASSERT_TRUE(client->Submit(b->view).ok());  // both in flight before either is collected
  EXPECT_EQ(client->outstanding(), 2);
  Tensor pa, pb;
  ASSERT_TRUE(client->Collect(pa, absl::Seconds(30)).ok());
  ASSERT_TRUE(client->Collect(pb, absl::Seconds(30)).ok());
  EXPECT_EQ(Values(pa), Local(*a));
  EXPECT_EQ(Values(pb), Local(*b));
  EXPECT_EQ(client->Collect(pa, absl::Milliseconds(10)).code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(CpuTierTest, SeveralWorkersAttach) {
  auto one = Connect();
  auto two = Connect();
  ASSERT_NE(one, nullptr);
  ASSERT_NE(two, nullptr);
  EXPECT_NE(one->channel_name(), two->channel_name());
  EXPECT_EQ(server_->cpu_tier().active_channels(), 2);
  auto a = MakeRequest(1, 2, 9);
  auto b = MakeRequest(1, 0, 4);
  ASSERT_TRUE(one->Submit(a->view).ok());
  ASSERT_TRUE(two->Submit(b->view).ok());
  Tensor pa, pb;
  ASSERT_TRUE(two->Collect(pb, absl::Seconds(30)).ok());
  ASSERT_TRUE(one->Collect(pa, absl::Seconds(30)).ok());
  EXPECT_EQ(Values(pa), Local(*a));
  EXPECT_EQ(Values(pb), Local(*b));
}

TEST_F(CpuTierTest, AFailedRequestGetsAnErrorAndTheChannelKeepsWorking) {
  auto client = Connect();
  ASSERT_NE(client, nullptr);
  auto bad = MakeRequest(1, 0, 2);
  bad->experts[0] = 999;  // no such expert
  ASSERT_TRUE(client->Submit(bad->view).ok());
  Tensor partial;
  const absl::Status failed = client->Collect(partial, absl::Seconds(30));
  EXPECT_EQ(failed.code(), absl::StatusCode::kInternal) << failed;
  EXPECT_NE(failed.message().find("out of range"), std::string::npos) << failed;

  auto good = MakeRequest(2, 1, 4);
  ASSERT_TRUE(client->Submit(good->view).ok());
  ASSERT_TRUE(client->Collect(partial, absl::Seconds(30)).ok());
  EXPECT_EQ(Values(partial), Local(*good));
  EXPECT_TRUE(client->Alive());
}

TEST_F(CpuTierTest, ClientRejectsWhatTheChannelCannotCarry) {
  auto client = Connect();
  ASSERT_NE(client, nullptr);
  auto request = MakeRequest(1, 0, 2);
  ExpertRequestView prefetch = request->view;
  prefetch.kind = ExpertMessageKind::kPrefetch;
  EXPECT_EQ(client->Submit(prefetch).code(), absl::StatusCode::kInvalidArgument);
  ExpertRequestView wrong = request->view;
  wrong.num_tokens = 3;  // arrays hold two
  EXPECT_EQ(client->Submit(wrong).code(), absl::StatusCode::kInvalidArgument);
  std::vector<float> hidden((kMaxTokens + 8) * model_->config.hidden_size);
  std::vector<int32_t> experts((kMaxTokens + 8) * model_->config.top_k, -1);
  std::vector<float> weights(experts.size());
  ExpertRequestView big = request->view;
  big.num_tokens = kMaxTokens + 8;
  big.hidden = hidden;
  big.experts = experts;
  big.weights = weights;
  EXPECT_EQ(client->Submit(big).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(client->outstanding(), 0);
}

// The test plays a worker that writes raw bytes into the channel.
TEST_F(CpuTierTest, MalformedMessagesGetErrorResponses) {
  ScopedShmName name("cputier_raw");
  const ModelConfig& c = model_->config;
  auto channel = ShmChannel::Create(name.str(), {.slots = 2, .slot_bytes = 64 << 10});
  ASSERT_TRUE(channel.ok()) << channel.status();
  ASSERT_TRUE(Attach(server_->address(), name.str(), ::getpid()).ok());

  auto send = [&](absl::Span<const uint8_t> bytes) {
    auto slot = channel->outbound().Reserve(bytes.size(), absl::Seconds(10));
    ASSERT_TRUE(slot.ok()) << slot.status();
    std::copy(bytes.begin(), bytes.end(), slot->begin());
    ASSERT_TRUE(channel->outbound().Commit(bytes.size()).ok());
  };
  auto receive = [&](std::string* error, std::vector<float>* partial) {
    auto bytes = channel->inbound().Peek(absl::Seconds(30));
    ASSERT_TRUE(bytes.ok()) << bytes.status();
    auto response = DecodeExpertResponse(*bytes);
    ASSERT_TRUE(response.ok()) << response.status();
    *error = std::string(response->error);
    partial->assign(response->partial.begin(), response->partial.end());
    ASSERT_TRUE(channel->inbound().Pop().ok());
  };

  std::string error;
  std::vector<float> partial;
  const std::vector<uint8_t> garbage(100, 0xab);
  send(garbage);
  receive(&error, &partial);
  EXPECT_NE(error.find("bad magic"), std::string::npos) << error;

  const int32_t ids[] = {1, 3};
  ExpertRequestView prefetch;
  prefetch.kind = ExpertMessageKind::kPrefetch;
  prefetch.top_k = 2;
  prefetch.experts = ids;
  std::vector<uint8_t> bytes(ExpertPrefetchBytes(2));
  EncodeExpertRequest(prefetch, absl::MakeSpan(bytes));
  send(bytes);
  receive(&error, &partial);
  EXPECT_NE(error.find("only run requests"), std::string::npos) << error;

  // A request that fits its slot whose response would not (checked before running it).
  const uint32_t n = static_cast<uint32_t>((channel->outbound().slot_bytes() - 40) / 4);
  ASSERT_LE(ExpertRequestBytes(n, 0, 1), channel->outbound().slot_bytes());
  std::vector<float> ones(n, 1.0f);
  ExpertRequestView tall;
  tall.num_tokens = n;
  tall.hidden_size = 1;
  tall.hidden = ones;
  bytes.resize(ExpertRequestBytes(n, 0, 1));
  EncodeExpertRequest(tall, absl::MakeSpan(bytes));
  send(bytes);
  receive(&error, &partial);
  EXPECT_NE(error.find("exceeds the channel's slots"), std::string::npos) << error;

  auto good = MakeRequest(3, 1, 5);
  bytes.resize(ExpertRequestBytes(5, c.top_k, c.hidden_size));
  EncodeExpertRequest(good->view, absl::MakeSpan(bytes));
  send(bytes);
  receive(&error, &partial);
  EXPECT_EQ(error, "");
  EXPECT_EQ(partial, Local(*good));
}

// strata-expert-store serves only its own cluster: a call without the cluster token (or with
// another cluster's) is refused before anything is looked at.
TEST_F(CpuTierTest, CallsWithoutTheClusterTokenAreRefused) {
  auto stub = v1::ExpertStore::NewStub(
      grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials()));
  for (const std::string& secret : {std::string(), std::string(48, 'x')}) {
    grpc::ClientContext layout_context;
    if (!secret.empty()) ClusterToken::FromSecret(secret)->Attach(layout_context);
    v1::ExpertLayout layout;
    const grpc::Status s = stub->GetLayout(&layout_context, v1::GetLayoutRequest(), &layout);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED) << s.error_message();
    EXPECT_EQ(layout.segments_size(), 0);
  }
  const ModelConfig& c = model_->config;
  auto refused = CpuTierClient::Connect(server_->address(), "strata_test_cputier_w", kMaxTokens,
                                        c.top_k, static_cast<int>(c.hidden_size));
  EXPECT_TRUE(absl::IsUnauthenticated(refused.status())) << refused.status();
  EXPECT_EQ(server_->cpu_tier().active_channels(), 0);
}

// On TCP the expert store must have a token: without one it does not start.
TEST(CpuTierStartTest, TcpWithoutATokenIsRefused) {
  ExpertStoreServerOptions options;
  options.model_dir = kModel;
  options.listen = "127.0.0.1:0";
  auto server = ExpertStoreServer::Start(options);
  EXPECT_TRUE(absl::IsInvalidArgument(server.status())) << server.status();
  EXPECT_THAT(std::string(server.status().message()), ::testing::HasSubstr("cluster token"));
}

TEST_F(CpuTierTest, AttachRefusesMissingAndForeignChannels) {
  EXPECT_EQ(Attach(server_->address(), "", ::getpid()).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  const grpc::Status missing = Attach(server_->address(), "strata_test_cputier_none", ::getpid());
  EXPECT_TRUE(missing.error_code() == grpc::StatusCode::NOT_FOUND ||
              missing.error_code() == grpc::StatusCode::UNAVAILABLE)
      << missing.error_message();
  ScopedShmName name("cputier_foreign");
  auto channel = ShmChannel::Create(name.str(), {.slots = 2, .slot_bytes = 4096});
  ASSERT_TRUE(channel.ok());
  EXPECT_EQ(Attach(server_->address(), name.str(), ::getpid() + 1).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_TRUE(WaitForChannels(server_->cpu_tier(), 0));
}

TEST_F(CpuTierTest, ClosingTheClientEndsTheStoreThread) {
  auto client = Connect();
  ASSERT_NE(client, nullptr);
  ASSERT_EQ(server_->cpu_tier().active_channels(), 1);
  client.reset();
  EXPECT_TRUE(WaitForChannels(server_->cpu_tier(), 0));
}

TEST_F(CpuTierTest, AKilledWorkerEndsTheStoreThread) {
  ScopedShmName name("cputier_killed");
  // The child only touches shared memory (no gRPC after fork); the parent attaches for it.
  ForkedChild worker([&] {
    auto channel = ShmChannel::Create(name.str(), {.slots = 2, .slot_bytes = 4096});
    if (!channel.ok()) return 2;
    if (!channel->WaitForPeer(absl::Seconds(30)).ok()) return 3;
    for (;;) ::pause();
  });
  ASSERT_TRUE(worker.started());
  grpc::Status attached;
  for (int i = 0; i < 100; ++i) {  // until the child has created the channel
    attached = Attach(server_->address(), name.str(), worker.pid());
    if (attached.ok()) break;
    absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_TRUE(attached.ok()) << attached.error_message();
  ASSERT_EQ(server_->cpu_tier().active_channels(), 1);
  ::kill(worker.pid(), SIGKILL);
  EXPECT_EQ(worker.Wait(absl::Seconds(10)), 1000 + SIGKILL);
  const absl::Time killed = absl::Now();
  EXPECT_TRUE(WaitForChannels(server_->cpu_tier(), 0));
  EXPECT_LT(absl::Now() - killed, absl::Seconds(2));  // liveness, not a timeout
}

TEST_F(CpuTierTest, StoppingTheStoreReleasesTheWorker) {
  auto client = Connect();
  ASSERT_NE(client, nullptr);
  auto request = MakeRequest(1, 0, 3);
  ASSERT_TRUE(client->Submit(request->view).ok());
  Tensor partial;
  ASSERT_TRUE(client->Collect(partial, absl::Seconds(30)).ok());

  const absl::Time start = absl::Now();
  server_.reset();  // stops and joins the channel's thread
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_FALSE(client->Alive());
  // Whether or not the ring still takes it, nothing answers: UNAVAILABLE, promptly.
  const absl::Status submitted = client->Submit(request->view);
  if (submitted.ok()) {
    const absl::Time asked = absl::Now();
    EXPECT_EQ(client->Collect(partial, absl::Seconds(30)).code(), absl::StatusCode::kUnavailable);
    EXPECT_LT(absl::Now() - asked, absl::Seconds(2));
  } else {
    EXPECT_EQ(submitted.code(), absl::StatusCode::kUnavailable);
  }
}

}  // namespace
}  // namespace strata
