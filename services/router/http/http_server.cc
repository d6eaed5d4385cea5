#include "services/router/http/http_server.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <functional>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace strata {
namespace {

// Milliseconds to wait from now until `deadline` (0 once it passed), for poll().
int MillisUntil(absl::Time deadline) {
  return static_cast<int>(std::max<int64_t>(0, absl::ToInt64Milliseconds(deadline - absl::Now())));
}

// One recv into `buffer` after waiting for data until `deadline`; false on close or timeout.
bool ReadSome(int fd, std::string& buffer, absl::Time deadline) {
  pollfd p{fd, POLLIN, 0};
  if (poll(&p, 1, MillisUntil(deadline)) <= 0) return false;
  char chunk[65536];
  const ssize_t n = recv(fd, chunk, sizeof(chunk), 0);
  if (n <= 0) return false;
  buffer.append(chunk, static_cast<size_t>(n));
  return true;
}

// Reads until `buffer` holds a whole header block: its first byte within `idle`, the rest
// within `headers` of it (however slowly it trickles: the deadline does not move);
// `on_first_byte` runs when it comes. False on close, timeout or oversize.
bool ReadHeaders(int fd, std::string& buffer, size_t limit, absl::Duration idle,
                 absl::Duration headers, const std::atomic<bool>& stopping,
                 const std::function<void()>& on_first_byte) {
  if (buffer.empty()) {
    // Waits in slices so that a stop is noticed.
    const absl::Time idle_deadline = absl::Now() + idle;
    while (buffer.empty()) {
      if (stopping.load() || absl::Now() >= idle_deadline) return false;
      if (!ReadSome(fd, buffer, std::min(idle_deadline, absl::Now() + absl::Seconds(1))) &&
          buffer.empty()) {
        pollfd p{fd, POLLIN | POLLRDHUP, 0};
        if (poll(&p, 1, 0) > 0) return false;  // closed or reset, not just quiet
      }
    }
  }
  on_first_byte();
  const absl::Time deadline = absl::Now() + headers;
  while (buffer.find("\r\n\r\n") == std::string::npos) {
    if (buffer.size() > limit || stopping.load()) return false;
    if (!ReadSome(fd, buffer, deadline)) return false;
  }
  return buffer.find("\r\n\r\n") <= limit;
}

// Reads and drops up to `length` bytes (at most 64 MiB, a second of silence ends it).
void DiscardBody(int fd, size_t length) {
  length = std::min<size_t>(length, size_t{64} << 20);
  char chunk[65536];
  while (length > 0) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 1000) <= 0) return;
    const ssize_t n = recv(fd, chunk, std::min(sizeof(chunk), length), 0);
    if (n <= 0) return;
    length -= static_cast<size_t>(n);
  }
}

// Parses the request line and headers of buffer[0, end).
bool ParseHead(absl::string_view head, HttpRequest& request) {
  size_t line_end = head.find("\r\n");
  const absl::string_view line = head.substr(0, line_end);
  const size_t a = line.find(' ');
  const size_t b = line.rfind(' ');
  if (a == absl::string_view::npos || b == a) return false;
  request.method = std::string(line.substr(0, a));
  std::string target(line.substr(a + 1, b - a - 1));
  if (const size_t q = target.find('?'); q != std::string::npos) target.resize(q);
  request.path = std::move(target);
  if (!absl::StartsWith(line.substr(b + 1), "HTTP/1.")) return false;
  size_t pos = line_end + 2;
  while (pos < head.size()) {
    size_t next = head.find("\r\n", pos);
    if (next == absl::string_view::npos) next = head.size();
    const absl::string_view h = head.substr(pos, next - pos);
    const size_t colon = h.find(':');
    if (colon == absl::string_view::npos) return false;
    const std::string name = absl::AsciiStrToLower(h.substr(0, colon));
    // Two lengths could be read two ways by a proxy in front: refused, as is a body framing
    // this server does not read (Transfer-Encoding), whatever comes with it.
    if (name == "content-length" && request.headers.count(name) > 0) return false;
    request.headers[name] = std::string(absl::StripAsciiWhitespace(h.substr(colon + 1)));
    pos = next + 2;
  }
  return true;
}

std::string ErrorBody(absl::string_view message, absl::string_view type) {
  // Plain JSON by hand: the server layer knows nothing of the API's JSON library.
  std::string escaped;
  for (char c : message) {
    if (c == '"' || c == '\\') escaped += '\\';
    escaped += c;
  }
  return absl::StrCat("{\"error\": {\"message\": \"", escaped, "\", \"type\": \"", type,
                      "\", \"param\": null, \"code\": null}}");
}

}  // namespace

const char* HttpReason(int status) {
  switch (status) {
    case 200:
      return "OK";
    case 400:
      return "Bad Request";
    case 401:
      return "Unauthorized";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 408:
      return "Request Timeout";
    case 411:
      return "Length Required";
    case 413:
      return "Payload Too Large";
    case 429:
      return "Too Many Requests";
    case 431:
      return "Request Header Fields Too Large";
    case 500:
      return "Internal Server Error";
    case 503:
      return "Service Unavailable";
    default:
      return "Unknown";
  }
}

absl::Status HttpResponder::WriteAll(absl::string_view data) {
  while (!data.empty()) {
    const ssize_t n = send(fd_, data.data(), data.size(), MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::UnavailableError(absl::StrCat("the client went away: ", std::strerror(errno)));
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
  return absl::OkStatus();
}

void HttpResponder::AddHeader(absl::string_view name, absl::string_view value) {
  absl::StrAppend(&extra_headers_, name, ": ", value, "\r\n");
}

absl::Status HttpResponder::Send(int status, absl::string_view content_type,
                                 absl::string_view body) {
  responded_ = true;
  return WriteAll(absl::StrCat(
      "HTTP/1.1 ", status, " ", HttpReason(status), "\r\nContent-Type: ", content_type,
      "\r\nContent-Length: ", body.size(), keep_alive_ ? "\r\n" : "\r\nConnection: close\r\n",
      extra_headers_, "\r\n", body));
}

absl::Status HttpResponder::StartStream(int status, absl::string_view content_type) {
  responded_ = true;
  return WriteAll(
      absl::StrCat("HTTP/1.1 ", status, " ", HttpReason(status), "\r\nContent-Type: ", content_type,
                   "\r\nCache-Control: no-cache\r\nTransfer-Encoding: chunked",
                   keep_alive_ ? "\r\n" : "\r\nConnection: close\r\n", extra_headers_, "\r\n"));
}

absl::Status HttpResponder::WriteChunk(absl::string_view data) {
  if (data.empty()) return absl::OkStatus();  // an empty chunk would end the stream
  return WriteAll(absl::StrCat(absl::Hex(data.size()), "\r\n", data, "\r\n"));
}

absl::Status HttpResponder::EndStream() { return WriteAll("0\r\n\r\n"); }

bool HttpResponder::ClientGone() const {
  pollfd p{fd_, POLLIN | POLLRDHUP, 0};
  if (poll(&p, 1, 0) <= 0) return false;
  if (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) return true;
  char byte;
  // Readable: a pipelined request (still here) or the end of the stream (gone).
  return recv(fd_, &byte, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
}

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(const HttpServerOptions& options,
                                                              HttpHandler handler) {
  std::unique_ptr<HttpServer> s(new HttpServer(options));
  s->handler_ = std::move(handler);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  const std::string port = absl::StrCat(options.port);
  const std::string host = options.host == "0.0.0.0" || options.host.empty() ? "" : options.host;
  if (int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), port.c_str(), &hints, &found);
      rc != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("HTTP address ", options.host, ":", port, ": ", gai_strerror(rc)));
  }
  std::string error = "no address";
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, 128) == 0) {
      s->listen_fd_ = fd;
      break;
    }
    error = std::strerror(errno);
    close(fd);
  }
  freeaddrinfo(found);
  if (s->listen_fd_ < 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen for HTTP on ", options.host, ":", port, ": ", error));
  }
  sockaddr_storage bound{};
  socklen_t length = sizeof(bound);
  getsockname(s->listen_fd_, reinterpret_cast<sockaddr*>(&bound), &length);
  s->port_ = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                               : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  s->acceptor_ = std::thread([raw = s.get()] { raw->AcceptLoop(); });
  return s;
}

HttpServer::HttpServer(const HttpServerOptions& options)
    : options_(options),
      bodies_(
          RequestBudgetOptions{.total_bytes = options.max_inflight_body_bytes,
                               .per_client_bytes = options.max_inflight_body_bytes_per_client}) {}

bool HttpServer::EvictOneLocked() {
  auto pick = [&](Phase phase, absl::Duration at_least) {
    auto oldest = connections_.end();
    for (auto it = connections_.begin(); it != connections_.end(); ++it) {
      const Connection& c = it->second;
      if (c.evicted || c.phase != phase || absl::Now() - c.since < at_least) continue;
      if (oldest == connections_.end() || c.since < oldest->second.since) oldest = it;
    }
    return oldest;
  };
  // A second's grace: a connection just accepted is "idle" until its first byte is read.
  auto victim = pick(Phase::kIdle, absl::Seconds(1));
  if (victim == connections_.end()) victim = pick(Phase::kReading, absl::Seconds(1));
  if (victim == connections_.end()) return false;
  victim->second.evicted = true;
  --active_;
  shutdown(victim->first, SHUT_RDWR);  // its thread sees the end and goes
  return true;
}

bool HttpServer::SetPhase(int fd, Phase phase) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = connections_.find(fd);
  if (it == connections_.end() || it->second.evicted) return false;
  it->second.phase = phase;
  it->second.since = absl::Now();
  return true;
}

void HttpServer::AcceptLoop() {
  while (!stopping_.load()) {
    pollfd p{listen_fd_, POLLIN, 0};
    if (poll(&p, 1, 100) <= 0) continue;
    sockaddr_storage peer{};
    socklen_t peer_length = sizeof(peer);
    const int fd =
        accept4(listen_fd_, reinterpret_cast<sockaddr*>(&peer), &peer_length, SOCK_CLOEXEC);
    if (fd < 0) continue;
    char host[INET6_ADDRSTRLEN] = "";
    if (peer.ss_family == AF_INET) {
      inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(&peer)->sin_addr, host, sizeof(host));
    } else if (peer.ss_family == AF_INET6) {
      inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(&peer)->sin6_addr, host, sizeof(host));
    }
    std::unique_lock<std::mutex> lock(mu_);
    if (stopping_.load() || (active_ >= options_.max_connections && !EvictOneLocked())) {
      lock.unlock();
      HttpResponder busy(fd);
      busy.set_keep_alive(false);
      busy.Send(503, "application/json",
                ErrorBody("too many connections; retry later", "server_error"))
          .IgnoreError();
      close(fd);
      continue;
    }
    // A client that stops reading cannot hold a handler in send() for longer than this.
    const timeval send_timeout{.tv_sec = options_.send_timeout_s, .tv_usec = 0};
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &send_timeout, sizeof(send_timeout));
    connections_[fd] = Connection{.phase = Phase::kIdle, .since = absl::Now()};
    ++active_;
    lock.unlock();
    std::thread([this, fd, client = std::string(host)] {
      Serve(fd, client);
      std::lock_guard<std::mutex> guard(mu_);
      auto it = connections_.find(fd);
      if (it != connections_.end()) {
        if (!it->second.evicted) --active_;
        connections_.erase(it);
      }
      close(fd);
      idle_cv_.notify_all();
    }).detach();
  }
}

void HttpServer::Serve(int fd, const std::string& client) {
  std::string buffer;
  while (!stopping_.load()) {
    SetPhase(fd, Phase::kIdle);
    if (!ReadHeaders(fd, buffer, options_.max_header_bytes, absl::Seconds(options_.idle_timeout_s),
                     absl::Seconds(options_.header_timeout_s), stopping_,
                     [&] { SetPhase(fd, Phase::kReading); })) {
      if (buffer.size() > options_.max_header_bytes) {
        HttpResponder r(fd);
        r.set_keep_alive(false);
        r.Send(431, "application/json",
               ErrorBody("the headers are too large", "invalid_request_error"))
            .IgnoreError();
      }
      return;
    }
    const size_t head_end = buffer.find("\r\n\r\n");
    HttpRequest request;
    request.client = client;
    HttpResponder responder(fd);
    if (!ParseHead(absl::string_view(buffer).substr(0, head_end), request)) {
      responder.set_keep_alive(false);
      responder
          .Send(400, "application/json",
                ErrorBody("malformed HTTP request", "invalid_request_error"))
          .IgnoreError();
      return;
    }
    buffer.erase(0, head_end + 4);
    size_t length = 0;
    if (request.headers.count("transfer-encoding") > 0) {
      responder.set_keep_alive(false);
      responder
          .Send(411, "application/json",
                ErrorBody("send the body with a Content-Length (no Transfer-Encoding)",
                          "invalid_request_error"))
          .IgnoreError();
      return;
    }
    if (auto it = request.headers.find("content-length"); it != request.headers.end()) {
      if (!absl::SimpleAtoi(it->second, &length)) {
        responder.set_keep_alive(false);
        responder
            .Send(400, "application/json", ErrorBody("bad Content-Length", "invalid_request_error"))
            .IgnoreError();
        return;
      }
    }
    if (length > options_.max_body_bytes) {
      responder.set_keep_alive(false);
      // Read what the client still sends (bounded) so that it sees the answer, not a reset.
      DiscardBody(fd, length - std::min(length, buffer.size()));
      responder
          .Send(413, "application/json",
                ErrorBody(absl::StrCat("the body of ", length, " bytes is over the limit of ",
                                       options_.max_body_bytes),
                          "invalid_request_error"))
          .IgnoreError();
      return;
    }
    // The body's bytes count against the budgets as they arrive, until it is handed over: a
    // client that announces a large body and sends little holds little.
    absl::StatusOr<RequestBudget::Hold> hold =
        bodies_.Take(client, static_cast<int64_t>(std::min(length, buffer.size())));
    const absl::Time body_deadline = absl::Now() + absl::Seconds(options_.body_timeout_s);
    while (hold.ok() && buffer.size() < length) {
      const size_t before = buffer.size();
      if (!ReadSome(fd, buffer, body_deadline)) return;
      const absl::Status grown =
          hold->Grow(static_cast<int64_t>(std::min(buffer.size(), length) - before));
      if (!grown.ok()) hold = grown;
    }
    if (!hold.ok()) {
      responder.set_keep_alive(false);
      responder.Send(503, "application/json", ErrorBody(hold.status().message(), "server_error"))
          .IgnoreError();
      return;
    }
    request.body = buffer.substr(0, length);
    buffer.erase(0, length);
    auto connection = request.headers.find("connection");
    if (connection != request.headers.end() &&
        absl::AsciiStrToLower(connection->second) == "close") {
      responder.set_keep_alive(false);
    }
    hold->Release();  // bounded from here by the connection limit and the scheduler's queue
    // Evicted while its request was read (already buffered past the shutdown): the room is
    // another's now, so handling it would run one connection past the cap.
    if (!SetPhase(fd, Phase::kHandling)) return;
    handler_(request, responder);
    if (!responder.responded()) {
      responder.Send(500, "application/json", ErrorBody("no response", "server_error"))
          .IgnoreError();
    }
    if (!responder.keep_alive()) return;
  }
}

void HttpServer::Shutdown() {
  if (stopping_.exchange(true)) return;
  if (acceptor_.joinable()) acceptor_.join();
  std::unique_lock<std::mutex> lock(mu_);
  for (const auto& [fd, connection] : connections_) shutdown(fd, SHUT_RDWR);
  idle_cv_.wait(lock, [this] { return connections_.empty(); });
  if (listen_fd_ >= 0) close(listen_fd_);
  listen_fd_ = -1;
}

HttpServer::~HttpServer() { Shutdown(); }

}  // namespace strata
