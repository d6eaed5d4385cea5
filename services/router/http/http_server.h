// A small HTTP/1.1 server: one thread per connection (the handlers block while a generation
// runs), keep-alive, bodies by Content-Length, responses whole or chunked (for server-sent
// events), and a way for a handler to notice that its client has gone.
//
// Against clients that hold connections without using them: a request's headers must arrive
// within header_timeout_s of its first byte and its body within body_timeout_s (a byte now and
// then does not keep it open), and a write the client does not read within send_timeout_s
// fails; at max_connections a new connection takes the place of the one idle longest (or
// reading a request longest), and is refused with 503 only when every one is handling a
// request; the bytes of bodies being read count against byte budgets (total and per client
// address) and beyond them get 503 at once. Transfer-Encoding and repeated Content-Length
// headers are refused (a proxy in front could read them otherwise).
#ifndef STRATA_SERVICES_ROUTER_HTTP_HTTP_SERVER_H_
#define STRATA_SERVICES_ROUTER_HTTP_HTTP_SERVER_H_

#include <atomic>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "services/router/request_budget.h"

namespace strata {

struct HttpServerOptions {
  std::string host = "127.0.0.1";
  int port = 0;                     // 0 picks a free port
  size_t max_body_bytes = 8 << 20;  // larger bodies get 413
  size_t max_header_bytes = 64 << 10;
  int max_connections = 512;  // beyond this the longest idle (or slowest) one makes room
  int idle_timeout_s = 60;    // a keep-alive connection with no request for this long closes
  int header_timeout_s = 10;  // from a request's first byte to the end of its headers
  int body_timeout_s = 30;    // from the end of its headers to the end of its body
  int send_timeout_s = 30;    // a response write the client does not take in this long fails
  // Bodies being read or handled at once: in all, and from one client address.
  int64_t max_inflight_body_bytes = int64_t{64} << 20;
  int64_t max_inflight_body_bytes_per_client = int64_t{32} << 20;
};

struct HttpRequest {
  std::string client;  // the peer's address, without its port
  std::string method;
  std::string path;                            // without the query string
  std::map<std::string, std::string> headers;  // names lower-cased
  std::string body;
};

// A handler's side of one exchange. Either Send once, or StartStream, WriteChunk... EndStream.
class HttpResponder {
 public:
  explicit HttpResponder(int fd) : fd_(fd) {}

  absl::Status Send(int status, absl::string_view content_type, absl::string_view body);
  absl::Status StartStream(int status, absl::string_view content_type);
  absl::Status WriteChunk(absl::string_view data);
  absl::Status EndStream();
  // Whether the client closed its end (or reset the connection): the handler should stop.
  bool ClientGone() const;

  bool responded() const { return responded_; }
  bool keep_alive() const { return keep_alive_; }
  void set_keep_alive(bool keep) { keep_alive_ = keep; }
  // A header for the response, before Send or StartStream (e.g. a 401's WWW-Authenticate). The
  // name and value are the handler's own, never a client's: nothing here escapes them.
  void AddHeader(absl::string_view name, absl::string_view value);

 private:
  absl::Status WriteAll(absl::string_view data);

  int fd_;
  bool responded_ = false;
  bool keep_alive_ = true;
  std::string extra_headers_;  // "Name: value\r\n" each
};

using HttpHandler = std::function<void(const HttpRequest&, HttpResponder&)>;

class HttpServer {
 public:
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(const HttpServerOptions& options,
                                                           HttpHandler handler);
  ~HttpServer();

  int port() const { return port_; }
  // Stops accepting, closes every connection (handlers see ClientGone) and waits for them.
  void Shutdown();

 private:
  // What a connection is doing, for choosing one to close when all are taken.
  enum class Phase { kIdle, kReading, kHandling };
  struct Connection {
    Phase phase = Phase::kIdle;
    absl::Time since;  // of the phase
    bool evicted = false;
  };

  explicit HttpServer(const HttpServerOptions& options);
  void AcceptLoop();
  void Serve(int fd, const std::string& client);
  // False when the connection was evicted (its room went to another): it must not go on.
  bool SetPhase(int fd, Phase phase);
  // Under mu_: closes the connection idle longest, else the one reading a request longest
  // (either for at least a second); false when there is none such.
  bool EvictOneLocked();

  HttpServerOptions options_;
  HttpHandler handler_;
  RequestBudget bodies_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stopping_{false};
  std::thread acceptor_;
  std::mutex mu_;
  std::condition_variable idle_cv_;
  std::map<int, Connection> connections_;  // by descriptor, guarded by mu_
  int active_ = 0;                         // connection threads alive, less those evicted
};

// The standard reason phrase of a status code.
const char* HttpReason(int status);

}  // namespace strata

#endif  // STRATA_SERVICES_ROUTER_HTTP_HTTP_SERVER_H_
