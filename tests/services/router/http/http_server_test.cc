// The HTTP server against clients that hold connections without using them: slow headers and
// bodies are cut at their deadlines, idle connections make room for new ones at the cap, and
// bodies beyond the byte budgets are refused at once.
#include "services/router/http/http_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace strata {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// A raw client connection.
class Client {
 public:
  explicit Client(int port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = ::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
  }
  ~Client() { ::close(fd_); }
  bool connected() const { return connected_; }
  bool Send(const std::string& data) {
    return ::send(fd_, data.data(), data.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(data.size());
  }
  // What arrives until the server closes or `timeout` passes.
  std::string ReadAll(std::chrono::milliseconds timeout = std::chrono::seconds(5)) {
    std::string out;
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      pollfd p{fd_, POLLIN, 0};
      const int ms = static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                          deadline - std::chrono::steady_clock::now())
                                          .count());
      if (::poll(&p, 1, std::max(ms, 0)) <= 0) break;
      char chunk[4096];
      const ssize_t n = ::recv(fd_, chunk, sizeof(chunk), 0);
      if (n <= 0) {
        closed_ = true;
        break;
      }
      out.append(chunk, static_cast<size_t>(n));
      if (out.find("\r\n\r\n") != std::string::npos &&
          out.find("Content-Length") != std::string::npos) {
        const size_t length = std::stoul(out.substr(out.find("Content-Length: ") + 16));
        if (out.size() >= out.find("\r\n\r\n") + 4 + length) break;
      }
    }
    return out;
  }
  bool closed() const { return closed_; }

 private:
  int fd_ = -1;
  bool connected_ = false;
  bool closed_ = false;
};

std::string Post(const std::string& body) {
  return "POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: " + std::to_string(body.size()) +
         "\r\n\r\n" + body;
}

class HttpServerTest : public ::testing::Test {
 protected:
  void Start(HttpServerOptions options) {
    auto server = HttpServer::Start(options, [this](const HttpRequest& r, HttpResponder& out) {
      if (r.path == "/block") {
        blocked_.fetch_add(1);
        while (!release_.load()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      if (r.path == "/huge") {  // more than the socket buffers hold
        out.Send(200, "text/plain", std::string(64 << 20, 'h')).IgnoreError();
        return;
      }
      if (r.path == "/private") {  // headers are the handler's, header names lower-cased
        out.AddHeader("WWW-Authenticate", "Bearer");
        const auto it = r.headers.find("authorization");
        out.Send(401, "text/plain", it == r.headers.end() ? "none" : it->second).IgnoreError();
        return;
      }
      out.Send(200, "text/plain", "ok " + std::to_string(r.body.size())).IgnoreError();
    });
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
  }
  // Whether `n` requests reached the /block handler within 5 s.
  bool AwaitBlocked(int n) {
    for (int i = 0; i < 500 && blocked_.load() < n; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return blocked_.load() == n;
  }
  void TearDown() override {
    release_.store(true);
    if (server_) server_->Shutdown();
  }

  std::unique_ptr<HttpServer> server_;
  std::atomic<bool> release_{false};
  std::atomic<int> blocked_{0};
};

// A handler's own headers reach the client, with 401's reason phrase; a request's header names
// arrive lower-cased and values trimmed.
TEST_F(HttpServerTest, HandlerHeadersAndUnauthorized) {
  Start(HttpServerOptions());
  Client client(server_->port());
  ASSERT_TRUE(client.connected());
  ASSERT_TRUE(client.Send("GET /private HTTP/1.1\r\nHost: a\r\nAuthorization:  Bearer k \r\n\r\n"));
  const std::string reply = client.ReadAll();
  EXPECT_THAT(reply, HasSubstr("HTTP/1.1 401 Unauthorized\r\n"));
  EXPECT_THAT(reply, HasSubstr("\r\nWWW-Authenticate: Bearer\r\n"));
  EXPECT_THAT(reply, HasSubstr("\r\n\r\nBearer k"));
  // The next request on the connection carries none of them.
  ASSERT_TRUE(client.Send("GET /x HTTP/1.1\r\nHost: a\r\n\r\n"));
  EXPECT_THAT(client.ReadAll(), Not(HasSubstr("WWW-Authenticate")));
}

// A client trickling its headers a byte at a time is cut off at header_timeout_s from its first
// byte, however often it sends.
TEST_F(HttpServerTest, SlowHeadersAreCutAtTheirDeadline) {
  HttpServerOptions options;
  options.header_timeout_s = 1;
  Start(options);
  Client slow(server_->port());
  ASSERT_TRUE(slow.connected());
  const auto start = std::chrono::steady_clock::now();
  const std::string request =
      "GET /x HTTP/1.1\r\nHost: a\r\nX-Slow: abcdefghijklmnopqrstuvwxyz\r\n";
  bool refused = false;
  for (char c : request) {
    if (!slow.Send(std::string(1, c))) {
      refused = true;
      break;
    }
    slow.ReadAll(std::chrono::milliseconds(100));
    if (slow.closed()) break;
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_TRUE(slow.closed() || refused);
  EXPECT_GT(seconds, 0.9);  // at its deadline, not before
  EXPECT_LT(seconds, 2.5);
}

// A body that stops arriving is cut at body_timeout_s.
TEST_F(HttpServerTest, SlowBodiesAreCutAtTheirDeadline) {
  HttpServerOptions options;
  options.body_timeout_s = 1;
  Start(options);
  Client slow(server_->port());
  ASSERT_TRUE(slow.connected());
  ASSERT_TRUE(slow.Send("POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 100\r\n\r\n0123456789"));
  const auto start = std::chrono::steady_clock::now();
  slow.ReadAll(std::chrono::seconds(5));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_TRUE(slow.closed());
  EXPECT_GT(seconds, 0.9);  // at its deadline, not before
  EXPECT_LT(seconds, 2.5);
}

// At the connection cap, idle connections make room: a new client is served. Only when every
// connection is handling a request is a new one refused (503).
TEST_F(HttpServerTest, IdleConnectionsMakeRoomAtTheCap) {
  HttpServerOptions options;
  options.max_connections = 8;
  Start(options);
  std::vector<std::unique_ptr<Client>> idle;
  for (int i = 0; i < 8; ++i) {
    idle.push_back(std::make_unique<Client>(server_->port()));
    ASSERT_TRUE(idle.back()->connected());
  }
  // Idle past the second's grace a new connection gives an idle one.
  std::this_thread::sleep_for(std::chrono::milliseconds(1200));
  for (int i = 0; i < 3; ++i) {
    Client fresh(server_->port());
    ASSERT_TRUE(fresh.Send(Post("hi")));
    EXPECT_THAT(fresh.ReadAll(), HasSubstr("200 OK")) << i;
  }
  // The fresh clients have gone, but under load the server may not have seen them go yet: past
  // the grace they are evictable too, so the busy clients below always find room.
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  // Eight requests that hold their connections: the ninth client has nowhere to go.
  std::vector<std::unique_ptr<Client>> busy;
  for (int i = 0; i < 8; ++i) {
    busy.push_back(std::make_unique<Client>(server_->port()));
    ASSERT_TRUE(busy.back()->Send("POST /block HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n"));
  }
  ASSERT_TRUE(AwaitBlocked(8)) << blocked_.load();
  Client refused(server_->port());
  refused.Send(Post("hi"));
  EXPECT_THAT(refused.ReadAll(), HasSubstr("503"));
  release_.store(true);
  for (auto& c : busy) EXPECT_THAT(c->ReadAll(), HasSubstr("200 OK"));
}

// The bytes of bodies being read count against the budget: a body beyond it is refused at once,
// and a client that announces a large body and sends little holds only what it sent.
TEST_F(HttpServerTest, BodiesBeyondTheBudgetAreRefused) {
  HttpServerOptions options;
  options.max_inflight_body_bytes = 1000;
  options.max_inflight_body_bytes_per_client = 1000;
  Start(options);
  Client holder(server_->port());
  ASSERT_TRUE(holder.Send("POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 900\r\n\r\n" +
                          std::string(700, 'x')));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  Client second(server_->port());
  ASSERT_TRUE(second.Send(Post(std::string(800, 'y'))));
  const std::string answer = second.ReadAll();
  EXPECT_THAT(answer, HasSubstr("503"));
  EXPECT_THAT(answer, HasSubstr("bytes of requests being prepared"));
  Client small(server_->port());
  ASSERT_TRUE(small.Send(Post("tiny")));
  EXPECT_THAT(small.ReadAll(), HasSubstr("ok 4"));
  ASSERT_TRUE(holder.Send(std::string(200, 'x')));
  EXPECT_THAT(holder.ReadAll(), HasSubstr("ok 900"));
  // Handled bodies no longer count: a request being handled holds nothing.
  Client blocked(server_->port());
  ASSERT_TRUE(blocked.Send("POST /block HTTP/1.1\r\nHost: a\r\nContent-Length: 900\r\n\r\n" +
                           std::string(900, 'z')));
  ASSERT_TRUE(AwaitBlocked(1)) << blocked_.load();
  Client after(server_->port());
  ASSERT_TRUE(after.Send(Post(std::string(800, 'w'))));
  EXPECT_THAT(after.ReadAll(), HasSubstr("ok 800"));
}

// Body framing a proxy in front could read another way is refused: Transfer-Encoding (with or
// without a length) and a repeated Content-Length.
TEST_F(HttpServerTest, AmbiguousBodiesAreRefused) {
  Start(HttpServerOptions());
  Client chunked(server_->port());
  ASSERT_TRUE(
      chunked.Send("POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 4\r\n"
                   "Transfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /y HTTP/1.1\r\n\r\n"));
  const std::string answer = chunked.ReadAll();
  EXPECT_THAT(answer, HasSubstr("411"));
  EXPECT_THAT(answer, Not(HasSubstr("200 OK")));
  Client twice(server_->port());
  ASSERT_TRUE(
      twice.Send("POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 4\r\n"
                 "Content-Length: 40\r\n\r\nabcd"));
  EXPECT_THAT(twice.ReadAll(), HasSubstr("400"));
}

// A client that stops reading its response cannot hold its connection: the write fails after
// send_timeout_s and the place is free again.
TEST_F(HttpServerTest, ClientsThatStopReadingAreLetGo) {
  HttpServerOptions options;
  options.max_connections = 1;
  options.send_timeout_s = 1;
  Start(options);
  Client stuck(server_->port());
  ASSERT_TRUE(stuck.Send("POST /huge HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n"));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  bool served = false;
  const auto start = std::chrono::steady_clock::now();
  while (!served && std::chrono::steady_clock::now() - start < std::chrono::seconds(5)) {
    Client next(server_->port());
    next.Send(Post("hi"));
    served = next.ReadAll(std::chrono::milliseconds(500)).find("200 OK") != std::string::npos;
  }
  EXPECT_TRUE(served);
}

}  // namespace
}  // namespace strata
