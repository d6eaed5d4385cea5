#include "common/util/grpc_listen.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "grpc_health/v1/health.grpc.pb.h"
#include "gtest/gtest.h"

namespace strata {
namespace {

using ::testing::HasSubstr;

// A socket listening on 127.0.0.1 with SO_REUSEPORT, as another gRPC server's would be.
class HeldPort {
 public:
  HeldPort() {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    const int one = 1;
    ::setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    ::setsockopt(fd_, SOL_SOCKET, SO_REUSEPORT, &one, sizeof(one));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
    ::listen(fd_, 4);
    socklen_t len = sizeof(addr);
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
  }
  ~HeldPort() { ::close(fd_); }
  int port() const { return port_; }

 private:
  int fd_ = -1;
  int port_ = 0;
};

TEST(GrpcListenTest, PortZeroPicksAFreePort) {
  grpc::ServerBuilder builder;
  grpc::health::v1::Health::CallbackService service;  // a server needs a service
  builder.RegisterService(&service);
  auto listening = StartListening(builder, "127.0.0.1:0");
  ASSERT_TRUE(listening.ok()) << listening.status();
  EXPECT_THAT(listening->address, ::testing::StartsWith("127.0.0.1:"));
  EXPECT_NE(listening->address, "127.0.0.1:0");
  listening->server->Shutdown();
}

TEST(GrpcListenTest, APortAnotherSocketHoldsIsAnError) {
  HeldPort held;
  ASSERT_GT(held.port(), 0);
  const std::string address = absl::StrCat("127.0.0.1:", held.port());
  grpc::ServerBuilder builder;
  auto listening = StartListening(builder, address);
  ASSERT_FALSE(listening.ok());
  EXPECT_EQ(listening.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(listening.status().message(),
            absl::StrCat("cannot listen on ", address, ": port in use"));
}

TEST(GrpcListenTest, ASecondServerCannotShareTheFirstsPort) {
  grpc::ServerBuilder first_builder;
  grpc::health::v1::Health::CallbackService service;
  first_builder.RegisterService(&service);
  auto first = StartListening(first_builder, "127.0.0.1:0");
  ASSERT_TRUE(first.ok()) << first.status();
  grpc::ServerBuilder second_builder;
  grpc::health::v1::Health::CallbackService second_service;
  second_builder.RegisterService(&second_service);
  auto second = StartListening(second_builder, first->address);
  ASSERT_FALSE(second.ok());
  EXPECT_THAT(second.status().message(), HasSubstr("port in use"));
  first->server->Shutdown();
}

TEST(GrpcListenTest, NotAnAddress) {
  grpc::ServerBuilder builder;
  auto listening = StartListening(builder, "localhost");
  ASSERT_FALSE(listening.ok());
  EXPECT_THAT(listening.status().message(), HasSubstr("not HOST:PORT"));
}

}  // namespace
}  // namespace strata
