// A test suite's own cluster on models/strata-demo (one worker, one thread) with its HTTP API,
// started once for the suite: a gRPC Generation stub to it and its HTTP port.
#ifndef STRATA_TESTS_TESTING_DEMO_CLUSTER_TEST_H_
#define STRATA_TESTS_TESTING_DEMO_CLUSTER_TEST_H_

#include <grpcpp/grpcpp.h>

#include <string>

#include "gtest/gtest.h"
#include "strata/v1/generation.grpc.pb.h"
#include "tests/testing/cluster_process.h"
#include "tests/testing/http_post.h"

namespace strata::testing {

class DemoClusterTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    http_port_ = FreeTcpPort();
    cluster_ = new ClusterProcess(
        {"--model=" + std::string(STRATA_SOURCE_DIR) + "/models/strata-demo", "--workers=1",
         "--threads=1", "--http-port=" + std::to_string(http_port_)});
    stub_ = v1::Generation::NewStub(
                grpc::CreateChannel(cluster_->address(), grpc::InsecureChannelCredentials()))
                .release();
  }
  static void TearDownTestSuite() {
    delete stub_;
    delete cluster_;
    stub_ = nullptr;
    cluster_ = nullptr;
  }
  void SetUp() override { ASSERT_FALSE(cluster_->address().empty()) << "no cluster"; }

  static inline ClusterProcess* cluster_ = nullptr;
  static inline v1::Generation::Stub* stub_ = nullptr;
  static inline int http_port_ = 0;
};

}  // namespace strata::testing

#endif  // STRATA_TESTS_TESTING_DEMO_CLUSTER_TEST_H_
