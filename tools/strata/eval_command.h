// `strata eval`: perplexity of a model on a text file, in process or through a cluster, and
// how evenly the gate spreads tokens over the experts.
#ifndef STRATA_TOOLS_STRATA_EVAL_COMMAND_H_
#define STRATA_TOOLS_STRATA_EVAL_COMMAND_H_

#include <ostream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/engine/local_engine.h"
#include "common/placement/cache_policy.h"
#include "common/placement/placement_stats.h"  // Gini

namespace strata {

struct EvalOptions {
  LocalEngineOptions engine;  // model_dir is always needed: its tokenizer encodes the text
  std::string server;         // if set, score through this cluster instead of in process
  std::string text_file;
  int window = 256;           // tokens per scored window
  bool expert_stats = false;  // in process only: per-layer expert activation counts and Gini
  // In process only: the routing of every scored token replayed in text order as decode steps
  // (a token's distinct experts at each layer) against expert caches holding these shares of
  // all (layer, expert) pairs: LFU with aging as the workers' warm policy keeps it, and the
  // best fixed set (the experts the whole text uses most, the bound of any static hot set).
  std::vector<double> hit_rate_shares;
};

struct CacheHitRate {
  double share = 0;  // of all (layer, expert) pairs
  int slots = 0;
  double lfu = 0;  // hits / uses
  double best_static = 0;
};

struct EvalResult {
  double perplexity = 0.0;
  int64_t tokens = 0;  // scored tokens
  // FP8 keys and values: the tokens of the unscored pass that set their scales (0: none).
  int64_t kv_calibration_tokens = 0;
  // Per MoE layer, how often each expert was selected (empty without expert_stats).
  std::vector<std::vector<int64_t>> expert_counts;
  std::vector<CacheHitRate> hit_rates;  // by hit_rate_shares
};

// The hit rates of `trace` (one decode step's expert uses after another) for caches of
// `shares` of `pairs` (layer, expert) pairs: LFU with aging (halving every 8 x slots uses, as a
// worker's warm slots) and the best fixed set.
std::vector<CacheHitRate> SimulateExpertCaches(absl::Span<const ExpertKey> trace, int pairs,
                                               absl::Span<const double> shares);

// Sum of -log p over positions 1..n-1 of `logits` [n, vocab] for the window's ids.
double WindowNll(const Tensor& logits, absl::Span<const int32_t> ids);

// The method: the file is encoded without special tokens and cut into consecutive windows of
// `window` ids (a last window of one id is dropped); each window runs from position 0 with no
// BOS and its positions 1..len-1 are scored; perplexity = exp(mean negative log-likelihood).
absl::StatusOr<EvalResult> Evaluate(const EvalOptions& options);

// Prints {"perplexity": P, "tokens": N} (and "expert_gini" per layer, "gini_overall").
absl::Status RunEvalCommand(const EvalOptions& options, std::ostream& out);

}  // namespace strata

#endif  // STRATA_TOOLS_STRATA_EVAL_COMMAND_H_
