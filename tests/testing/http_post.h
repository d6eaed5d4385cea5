// A plain HTTP/1.1 client for tests of the router's OpenAI API: a free port to give it, a
// connection, and one exchange (Connection: close), raw or as the reply's status, headers and
// body.
#ifndef STRATA_TESTS_TESTING_HTTP_POST_H_
#define STRATA_TESTS_TESTING_HTTP_POST_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <vector>

namespace strata::testing {

// A TCP port nothing listens on now (bound and released).
inline int FreeTcpPort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  socklen_t length = sizeof(a);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &length);
  ::close(fd);
  return ntohs(a.sin_port);
}

struct HttpReply {
  int status = 0;    // 0: no reply
  std::string head;  // the status line and headers
  std::string body;
};

// A TCP connection to the loopback `port`; -1 if nothing accepts it.
inline int ConnectLoopback(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// One request of a JSON body (Connection: close), with `headers` ("Name: value" each) added:
// the whole response as received, headers and all; empty if nothing answered.
inline std::string RequestRaw(int port, const std::string& method, const std::string& path,
                              const std::string& body,
                              const std::vector<std::string>& headers = {}) {
  const int fd = ConnectLoopback(port);
  if (fd < 0) return "";
  std::string request = method + " " + path +
                        " HTTP/1.1\r\nHost: a\r\nContent-Type: application/json\r\n"
                        "Connection: close\r\nContent-Length: " +
                        std::to_string(body.size()) + "\r\n";
  for (const std::string& header : headers) request += header + "\r\n";
  request += "\r\n" + body;
  size_t sent = 0;
  while (sent < request.size()) {
    const ssize_t n = ::send(fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) break;
    sent += static_cast<size_t>(n);
  }
  std::string response;
  char chunk[4096];
  ssize_t n;
  while ((n = ::recv(fd, chunk, sizeof(chunk), 0)) > 0) response.append(chunk, n);
  ::close(fd);
  return response;
}

inline std::string PostRaw(int port, const std::string& path, const std::string& body) {
  return RequestRaw(port, "POST", path, body);
}

inline HttpReply Exchange(int port, const std::string& method, const std::string& path,
                          const std::string& body = "",
                          const std::vector<std::string>& headers = {}) {
  HttpReply reply;
  const std::string response = RequestRaw(port, method, path, body, headers);
  // "HTTP/1.1 200 OK\r\n...\r\n\r\nBODY"
  const size_t space = response.find(' ');
  const size_t end = response.find("\r\n\r\n");
  if (space == std::string::npos || end == std::string::npos) return reply;
  reply.status = std::atoi(response.c_str() + space + 1);
  reply.head = response.substr(0, end);
  reply.body = response.substr(end + 4);
  return reply;
}

inline HttpReply PostJson(int port, const std::string& path, const std::string& body) {
  return Exchange(port, "POST", path, body);
}

}  // namespace strata::testing

#endif  // STRATA_TESTS_TESTING_HTTP_POST_H_
