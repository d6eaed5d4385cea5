#include "services/router/worker_expert_backend.h"

#include <signal.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/shm/process_liveness.h"
#include "common/util/process.h"
#include "common/util/status_macros.h"

namespace strata {

WorkerExpertBackend::WorkerExpertBackend(const ModelConfig& config, PlacementPlan placement,
                                         WorkerExpertOptions options)
    : config_(config),
      placement_(std::move(placement)),
      num_workers_(placement_.num_workers),
      options_(options),
      connections_(placement_.num_workers),
      tiers_(placement_.num_workers),
      wants_prefetch_(placement_.num_workers, false),
      shares_memory_(placement_.num_workers, false),
      ever_usable_(placement_.num_workers, false),
      failures_(placement_.num_workers),
      staging_(placement_.num_workers) {
  lent_slots_ = std::make_unique<std::atomic<uint32_t>[]>(num_workers_);
  was_usable_ = std::make_unique<std::atomic<bool>[]>(num_workers_);
  for (int w = 0; w < num_workers_; ++w) {
    lent_slots_[w].store(0);
    was_usable_[w].store(false);
  }
}

void WorkerExpertBackend::set_lent_slots(int index, uint32_t slots) {
  if (index >= 0 && index < num_workers_) lent_slots_[index].store(slots);
}

uint32_t WorkerExpertBackend::lent_slots(int index) const {
  return index >= 0 && index < num_workers_ ? lent_slots_[index].load() : 0;
}

TierCounters WorkerExpertBackend::tiers(int index) const {
  std::lock_guard<std::mutex> lock(mu_);
  return index >= 0 && index < num_workers_ ? tiers_[index] : TierCounters();
}

std::vector<std::shared_ptr<ExpertConnection>> WorkerExpertBackend::Connections() const {
  std::lock_guard<std::mutex> lock(mu_);
  return connections_;
}

void WorkerExpertBackend::SetConnection(int index, std::shared_ptr<ExpertConnection> connection,
                                        bool wants_prefetch, bool shares_memory) {
  std::lock_guard<std::mutex> lock(mu_);
  connections_.at(index) = std::move(connection);
  wants_prefetch_.at(index) = wants_prefetch;
  shares_memory_.at(index) = shares_memory;
  tiered_workers_.store(
      static_cast<int>(std::count(wants_prefetch_.begin(), wants_prefetch_.end(), true)));
}

bool WorkerExpertBackend::shares_memory(int index) const {
  std::lock_guard<std::mutex> lock(mu_);
  return index >= 0 && index < num_workers_ && shares_memory_[index];
}

bool WorkerExpertBackend::wants_prefetch() const {
  // Asked every MoE layer: without a tiered worker (the common case) no lock, no liveness check.
  if (tiered_workers_.load() == 0) return false;
  std::lock_guard<std::mutex> lock(mu_);
  for (int w = 0; w < num_workers_; ++w) {
    if (wants_prefetch_[w] && connections_[w] && connections_[w]->Alive()) return true;
  }
  return false;
}

int WorkerExpertBackend::num_connected() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(std::count_if(connections_.begin(), connections_.end(),
                                        [](const auto& c) { return c && c->Alive(); }));
}

bool WorkerExpertBackend::connected(int index) const {
  std::lock_guard<std::mutex> lock(mu_);
  return index >= 0 && index < num_workers_ && connections_[index] && connections_[index]->Alive();
}

namespace {

// What is known of a worker failing now through `connection`, for `why`.
WorkerFailure FailureOf(const ExpertConnection& connection, const absl::Status& why) {
  return WorkerFailure{.stalled = connection.Stalled(),
                       .reason = std::string(why.message()),
                       .since = absl::Now(),
                       .process = connection.LocalProcess()};
}

}  // namespace

std::vector<bool> WorkerExpertBackend::Usable(
    const std::vector<std::shared_ptr<ExpertConnection>>& connections) {
  std::vector<bool> usable(num_workers_);
  for (int w = 0; w < num_workers_; ++w) {
    usable[w] = connections[w] && connections[w]->Alive();
    if (usable[w] == was_usable_[w].load(std::memory_order_relaxed)) continue;
    std::lock_guard<std::mutex> lock(mu_);
    if (usable[w] == was_usable_[w].load() || connections[w] != connections_[w]) continue;
    was_usable_[w].store(usable[w]);
    if (usable[w]) {
      failures_[w].reset();
      // A worker's first registration is no news (strata-worker logs it).
      if (!ever_usable_[w]) {
        ever_usable_[w] = true;
        continue;
      }
      Log(LogLevel::kWarning,
          absl::StrCat("expert worker ", w, " is back; it runs its own experts again"));
      continue;
    }
    const absl::Status why = connections[w]->PeerStatus();
    failures_[w] = FailureOf(*connections[w], why);
    // A worker that comes back registers again, on a channel of its own.
    connections[w]->Abandon();
    Log(LogLevel::kWarning, absl::StrCat("expert worker ", w, " is gone (", why.message(),
                                         "); the others run its experts"));
  }
  return usable;
}

void WorkerExpertBackend::Failed(int w, ExpertConnection& connection, const absl::Status& why) {
  std::lock_guard<std::mutex> lock(mu_);
  connection.Abandon();
  if (connections_[w].get() != &connection) return;  // replaced meanwhile
  if (!failures_[w]) failures_[w] = FailureOf(connection, why);
  was_usable_[w].store(false);
}

void WorkerExpertBackend::CheckWorkers() {
  Usable(Connections());
  std::lock_guard<std::mutex> lock(mu_);
  for (int w = 0; w < num_workers_; ++w) {
    std::optional<WorkerFailure>& f = failures_[w];
    if (!f || !f->stalled || f->killed || !f->process ||
        absl::Now() - f->since < options_.kill_stalled_after) {
      continue;
    }
    f->killed = true;
    // Only the very process that stalled (pid and start time), never one that took its pid.
    if (!ProcessAlive(f->process->pid, f->process->start_time)) continue;
    Log(LogLevel::kWarning,
        absl::StrCat("expert worker ", w, " (pid ", f->process->pid, ") has not answered for ",
                     absl::FormatDuration(absl::Now() - f->since),
                     "; killing it for its supervisor to restart"));
    ::kill(f->process->pid, SIGKILL);
  }
}

std::optional<WorkerFailure> WorkerExpertBackend::failure(int index) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (index < 0 || index >= num_workers_) return std::nullopt;
  return failures_[index];
}

std::vector<int> WorkerExpertBackend::EffectiveOwners(int layer,
                                                      const std::vector<bool>& usable) const {
  const std::vector<int>& planned = placement_.owner.at(layer);
  std::vector<int> alive;
  for (int w = 0; w < num_workers_; ++w) {
    if (usable[w]) alive.push_back(w);
  }
  std::vector<int> owner(planned.size(), -1);
  if (alive.empty()) return owner;
  for (size_t e = 0; e < planned.size(); ++e) {
    owner[e] = usable[planned[e]] ? planned[e] : alive[e % alive.size()];
  }
  return owner;
}

void WorkerExpertBackend::Prefetch(int layer, const RoutingTable& predicted) {
  std::vector<std::shared_ptr<ExpertConnection>> connections;
  std::vector<bool> hinted;
  {
    std::lock_guard<std::mutex> lock(mu_);
    connections = connections_;
    hinted = wants_prefetch_;
  }
  const std::vector<int> owner = EffectiveOwners(layer, Usable(connections));
  prefetch_lists_.resize(num_workers_);
  for (std::vector<int32_t>& list : prefetch_lists_) list.clear();
  for (int32_t e : predicted.expert) {
    if (e < 0 || e >= static_cast<int32_t>(owner.size()) || owner[e] < 0) continue;
    std::vector<int32_t>& list = prefetch_lists_[owner[e]];
    if (std::find(list.begin(), list.end(), e) == list.end()) list.push_back(e);
  }
  for (int w = 0; w < num_workers_; ++w) {
    if (prefetch_lists_[w].empty() || !hinted[w]) continue;
    // Only a hint: a worker that is gone shows up in the layer's exchange.
    connections[w]->Prefetch(static_cast<uint32_t>(layer), prefetch_lists_[w]).IgnoreError();
  }
}

absl::Status WorkerExpertBackend::RunExperts(int layer, const Tensor& x,
                                             const RoutingTable& routing, Tensor& out) {
  const std::vector<std::shared_ptr<ExpertConnection>> connections = Connections();
  std::vector<bool> usable = Usable(connections);
  // A worker that is gone (or fails during the layer) hands its experts to the others, which
  // map every expert from the expert store: the layer runs again without it, and no request
  // is lost. Its experts come back when it registers again.
  for (int attempt = 0; attempt < num_workers_; ++attempt) {
    if (std::none_of(usable.begin(), usable.end(), [](bool u) { return u; })) {
      return absl::UnavailableError("no expert worker is connected");
    }
    const std::vector<int> owner = EffectiveOwners(layer, usable);
    int failed = -1;
    const absl::Status status = Exchange(layer, x, routing, owner, connections, out, &failed);
    if (status.ok() || failed < 0) return status;
    usable[failed] = false;
    if (connections[failed] != nullptr) Failed(failed, *connections[failed], status);
    reroutes_.fetch_add(1);
    Log(LogLevel::kWarning, absl::StrCat("expert worker ", failed, " failed during layer ", layer,
                                         " (", status.message(), "); rerouting its experts"));
  }
  return absl::UnavailableError("every expert worker failed");
}

absl::Status WorkerExpertBackend::Exchange(
    int layer, const Tensor& x, const RoutingTable& routing, const std::vector<int>& owner,
    const std::vector<std::shared_ptr<ExpertConnection>>& connections, Tensor& out, int* failed) {
  const int64_t n = x.rows();
  const int64_t h = x.cols();
  const int k = routing.top_k;
  // Split the tokens by worker: a token goes to every worker that owns one of its experts.
  for (Staging& s : staging_) {
    s.rows.clear();
    s.hidden.clear();
    s.experts.clear();
    s.weights.clear();
  }
  for (int64_t t = 0; t < n; ++t) {
    for (int w = 0; w < num_workers_; ++w) {
      bool any = false;
      for (int j = 0; j < k; ++j) {
        const int32_t e = routing.expert[t * k + j];
        any = any || (e >= 0 && owner[e] == w);
      }
      if (!any) continue;
      Staging& s = staging_[w];
      s.rows.push_back(t);
      s.hidden.insert(s.hidden.end(), x.row(t), x.row(t) + h);
      for (int j = 0; j < k; ++j) {
        const int32_t e = routing.expert[t * k + j];
        const bool mine = e >= 0 && owner[e] == w;
        s.experts.push_back(mine ? e : -1);
        s.weights.push_back(mine ? routing.weight[t * k + j] : 0.0f);
      }
    }
  }
  // Every worker this layer needs must be there before anything is sent: a request left
  // unanswered would put its channel one response behind.
  for (int w = 0; w < num_workers_; ++w) {
    if (!staging_[w].rows.empty() && (!connections[w] || !connections[w]->Alive())) {
      *failed = w;
      return absl::UnavailableError(absl::StrCat("expert worker ", w, " is not connected"));
    }
  }
  const uint64_t step = NextStep();
  std::vector<bool> sent(num_workers_, false);
  absl::Status status;
  for (int w = 0; w < num_workers_ && status.ok(); ++w) {
    Staging& s = staging_[w];
    if (s.rows.empty()) continue;
    ExpertRequestView request;
    request.step = step;
    request.layer = static_cast<uint32_t>(layer);
    request.num_tokens = static_cast<uint32_t>(s.rows.size());
    request.top_k = static_cast<uint32_t>(k);
    request.hidden_size = static_cast<uint32_t>(h);
    request.hidden = s.hidden;
    request.experts = s.experts;
    request.weights = s.weights;
    request.hot_ratio = hot_ratio_.load();
    request.lent_slots = lent_slots(w);
    status = connections[w]->Send(request);
    sent[w] = status.ok();
    if (!status.ok()) *failed = w;
  }
  out.Resize(n, h);
  out.SetZero();
  // Collect every response that was asked for, even after a failure, so that each channel
  // stays in step with its requests.
  for (int w = 0; w < num_workers_; ++w) {
    if (!sent[w]) continue;
    const Staging& s = staging_[w];
    bool transport_failed = false;
    const absl::Status received = ReceiveResponse(
        w, *connections[w], step,
        [&](const ExpertResponseView& response) {
          if (response.num_tokens != s.rows.size() || response.hidden_size != h ||
              response.partial.size() != s.rows.size() * h) {
            return absl::DataLossError(
                absl::StrCat("expert worker ", w, " answered a different request"));
          }
          for (size_t r = 0; r < s.rows.size(); ++r) {
            float* dst = out.row(s.rows[r]);
            const float* src = response.partial.data() + r * h;
            for (int64_t i = 0; i < h; ++i) dst[i] += src[i];
          }
          return absl::OkStatus();
        },
        &transport_failed);
    if (transport_failed && *failed < 0) *failed = w;
    if (status.ok()) status = received;
  }
  return status;
}

absl::Status WorkerExpertBackend::ReceiveResponse(
    int w, ExpertConnection& connection, uint64_t step,
    absl::FunctionRef<absl::Status(const ExpertResponseView&)> consume, bool* transport_failed) {
  absl::Status consumed;
  bool stale = true;
  // A response to an earlier, abandoned exchange (a timeout) is skipped.
  for (int attempt = 0; stale && attempt < 4; ++attempt) {
    stale = false;
    const absl::Status received = connection.Receive(
        [&](const ExpertResponseView& response) {
          {
            std::lock_guard<std::mutex> lock(mu_);
            tiers_[w] = response.tiers;
          }
          if (response.step < step) {
            stale = true;
          } else if (!response.error.empty()) {
            consumed = absl::InternalError(absl::StrCat("expert worker ", w, ": ", response.error));
          } else if (response.step != step) {
            consumed = absl::DataLossError(
                absl::StrCat("expert worker ", w, " answered a different request"));
          } else {
            consumed = consume(response);
          }
        },
        options_.timeout);
    if (!received.ok()) {
      *transport_failed = true;
      return received;
    }
  }
  if (stale) {
    return absl::DataLossError(absl::StrCat("expert worker ", w, " is out of step"));
  }
  return consumed;
}

}  // namespace strata
