#include "services/router/http/http_server.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace strata {
namespace {

// Reads until `buffer` holds a whole header block; false on close, timeout or oversize.
bool ReadHeaders(int fd, std::string& buffer, size_t limit, int timeout_ms,
                 const std::atomic<bool>& stopping) {
  while (buffer.find("\r\n\r\n") == std::string::npos) {
    if (buffer.size() > limit || stopping.load()) return false;
    pollfd p{fd, POLLIN, 0};
    const int ready = poll(&p, 1, timeout_ms);
    if (ready <= 0) return false;
    char chunk[8192];
    const ssize_t n = recv(fd, chunk, sizeof(chunk), 0);
    if (n <= 0) return false;
    buffer.append(chunk, static_cast<size_t>(n));
  }
  return true;
}

bool ReadBody(int fd, std::string& buffer, size_t want) {
  while (buffer.size() < want) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 30000) <= 0) return false;
    char chunk[65536];
    const ssize_t n = recv(fd, chunk, sizeof(chunk), 0);
    if (n <= 0) return false;
    buffer.append(chunk, static_cast<size_t>(n));
  }
  return true;
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
    request.headers[absl::AsciiStrToLower(h.substr(0, colon))] =
        std::string(absl::StripAsciiWhitespace(h.substr(colon + 1)));
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

absl::Status HttpResponder::Send(int status, absl::string_view content_type,
                                 absl::string_view body) {
  responded_ = true;
  return WriteAll(absl::StrCat("HTTP/1.1 ", status, " ", HttpReason(status), "\r\nContent-Type: ",
                               content_type, "\r\nContent-Length: ", body.size(),
                               keep_alive_ ? "\r\n" : "\r\nConnection: close\r\n", "\r\n", body));
}

absl::Status HttpResponder::StartStream(int status, absl::string_view content_type) {
  responded_ = true;
  return WriteAll(absl::StrCat("HTTP/1.1 ", status, " ", HttpReason(status),
                               "\r\nContent-Type: ", content_type,
                               "\r\nCache-Control: no-cache\r\nTransfer-Encoding: chunked",
                               keep_alive_ ? "\r\n" : "\r\nConnection: close\r\n", "\r\n"));
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
  std::unique_ptr<HttpServer> s(new HttpServer());
  s->options_ = options;
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

void HttpServer::AcceptLoop() {
  while (!stopping_.load()) {
    pollfd p{listen_fd_, POLLIN, 0};
    if (poll(&p, 1, 100) <= 0) continue;
    const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    std::unique_lock<std::mutex> lock(mu_);
    if (stopping_.load() || active_ >= options_.max_connections) {
      lock.unlock();
      HttpResponder busy(fd);
      busy.set_keep_alive(false);
      busy.Send(503, "application/json",
                ErrorBody("too many connections; retry later", "server_error"))
          .IgnoreError();
      close(fd);
      continue;
    }
    connections_.insert(fd);
    ++active_;
    lock.unlock();
    std::thread([this, fd] {
      Serve(fd);
      std::lock_guard<std::mutex> guard(mu_);
      connections_.erase(fd);
      close(fd);
      --active_;
      idle_cv_.notify_all();
    }).detach();
  }
}

void HttpServer::Serve(int fd) {
  std::string buffer;
  while (!stopping_.load()) {
    if (!ReadHeaders(fd, buffer, options_.max_header_bytes, options_.idle_timeout_s * 1000,
                     stopping_)) {
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
    if (auto it = request.headers.find("content-length"); it != request.headers.end()) {
      if (!absl::SimpleAtoi(it->second, &length)) {
        responder.set_keep_alive(false);
        responder
            .Send(400, "application/json", ErrorBody("bad Content-Length", "invalid_request_error"))
            .IgnoreError();
        return;
      }
    } else if (request.headers.count("transfer-encoding") > 0) {
      responder.set_keep_alive(false);
      responder
          .Send(411, "application/json",
                ErrorBody("send the body with a Content-Length", "invalid_request_error"))
          .IgnoreError();
      return;
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
    if (!ReadBody(fd, buffer, length)) return;
    request.body = buffer.substr(0, length);
    buffer.erase(0, length);
    auto connection = request.headers.find("connection");
    if (connection != request.headers.end() &&
        absl::AsciiStrToLower(connection->second) == "close") {
      responder.set_keep_alive(false);
    }
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
  for (int fd : connections_) shutdown(fd, SHUT_RDWR);
  idle_cv_.wait(lock, [this] { return active_ == 0; });
  if (listen_fd_ >= 0) close(listen_fd_);
  listen_fd_ = -1;
}

HttpServer::~HttpServer() { Shutdown(); }

}  // namespace strata
