// `strata eval` twice over for the cluster tests: in this process and through a cluster's
// Score RPC. Needs strata_cli.
#ifndef STRATA_TESTS_TESTING_CLUSTER_EVAL_H_
#define STRATA_TESTS_TESTING_CLUSTER_EVAL_H_

#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/cluster_process.h"
#include "tools/strata/eval_command.h"

namespace strata::testing {

// Evaluates `options` (its `server` unset) in this process into `*local`, then through a
// cluster started with `cluster_args` into `*remote`. Fails the test if either evaluation
// fails or the cluster does not start or stop cleanly: call it inside ASSERT_NO_FATAL_FAILURE.
inline void EvaluateInProcessAndInCluster(EvalOptions options,
                                          const std::vector<std::string>& cluster_args,
                                          EvalResult* local, EvalResult* remote) {
  auto in_process = Evaluate(options);
  ASSERT_TRUE(in_process.ok()) << in_process.status();
  *local = *std::move(in_process);

  ClusterProcess cluster(cluster_args);
  ASSERT_FALSE(cluster.address().empty());
  options.server = cluster.address();
  auto served = Evaluate(options);
  ASSERT_TRUE(served.ok()) << served.status();
  *remote = *std::move(served);
  EXPECT_EQ(cluster.Stop(), 0);
}

}  // namespace strata::testing

#endif  // STRATA_TESTS_TESTING_CLUSTER_EVAL_H_
