#include "common/model/safetensors_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <mutex>
#include <numeric>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/util/status_macros.h"
#include "nlohmann/json.hpp"

namespace strata {
namespace {

absl::Status PwriteAll(int fd, const uint8_t* data, size_t n, uint64_t offset,
                       const std::string& path) {
  while (n > 0) {
    const ssize_t w = ::pwrite(fd, data, n, static_cast<off_t>(offset));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      return absl::InternalError(absl::StrCat(path, ": write failed: ", std::strerror(errno)));
    }
    data += w;
    n -= static_cast<size_t>(w);
    offset += static_cast<uint64_t>(w);
  }
  return absl::OkStatus();
}

// Page-aligned memory, as O_DIRECT needs.
struct AlignedBuffer {
  explicit AlignedBuffer(size_t size)
      : data(static_cast<uint8_t*>(std::aligned_alloc(kPage, (size + kPage - 1) / kPage * kPage))) {
  }
  ~AlignedBuffer() { std::free(data); }
  AlignedBuffer(AlignedBuffer&& other) noexcept : data(std::exchange(other.data, nullptr)) {}
  static constexpr size_t kPage = 4096;
  uint8_t* data;
};

}  // namespace

uint64_t SafetensorsTensorHeader::bytes() const {
  uint64_t n = DTypeSize(dtype);
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

absl::Status WriteTextFile(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  if (!out) return absl::PermissionDeniedError(absl::StrCat(path, ": cannot write"));
  return absl::OkStatus();
}

// The 8-byte length, the JSON header padded with spaces so the data starts page-aligned, then
// the tensors. `threads` generators fill chunk buffers in parallel and this thread alone writes
// them (concurrent writers of one file would take turns on its inode lock), with O_DIRECT where
// the file system allows it: no copy into the page cache, and no cache filled with a model that
// may be larger than memory.
absl::Status WriteSafetensorsFile(const std::string& path,
                                  absl::Span<const SafetensorsTensorHeader> tensors,
                                  const SafetensorsFill& fill, int threads) {
  constexpr uint64_t kPage = AlignedBuffer::kPage;
  std::vector<uint64_t> offsets = {0};  // of each tensor in the data area; last: data size
  for (const SafetensorsTensorHeader& t : tensors) offsets.push_back(offsets.back() + t.bytes());
  nlohmann::ordered_json header;
  header["__metadata__"] = {{"format", "pt"}};
  for (size_t i = 0; i < tensors.size(); ++i) {
    header[tensors[i].name] = {{"dtype", std::string(DTypeName(tensors[i].dtype))},
                               {"shape", tensors[i].shape},
                               {"data_offsets", {offsets[i], offsets[i + 1]}}};
  }
  std::string text = header.dump();
  text.resize((8 + text.size() + kPage - 1) / kPage * kPage - 8, ' ');
  const uint64_t data_size = offsets.back();
  const uint64_t data_begin = 8 + text.size();
  const uint64_t file_size = data_begin + data_size;
  const std::string& name = path;
  const int flags = O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC;
  int fd = ::open(name.c_str(), flags | O_DIRECT, 0644);
  bool direct = fd >= 0;
  if (!direct) fd = ::open(name.c_str(), flags, 0644);
  if (fd < 0) return absl::PermissionDeniedError(absl::StrCat(name, ": ", std::strerror(errno)));
  struct Closer {
    int fd;
    ~Closer() {
      if (fd >= 0) ::close(fd);
    }
  } closer{fd};
  const int rc = ::posix_fallocate(fd, 0, static_cast<off_t>(file_size));
  if (rc == ENOSPC) return absl::ResourceExhaustedError(absl::StrCat(name, ": disk full"));
  if (rc != 0 && ::ftruncate(fd, static_cast<off_t>(file_size)) != 0) {
    return absl::InternalError(absl::StrCat(name, ": ", std::strerror(errno)));
  }
  {
    AlignedBuffer head(data_begin);
    for (int i = 0; i < 8; ++i) head.data[i] = static_cast<uint8_t>(text.size() >> (8 * i));
    std::memcpy(head.data + 8, text.data(), text.size());
    absl::Status s = PwriteAll(fd, head.data, data_begin, 0, name);
    if (!s.ok() && direct) {  // O_DIRECT accepted by open() but not by write(): go buffered
      direct = ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_DIRECT) != 0;
      if (!direct) s = PwriteAll(fd, head.data, data_begin, 0, name);
    }
    RETURN_IF_ERROR(s);
  }

  // Direct writes want large requests; buffered ones a chunk that is still in cache when the
  // kernel copies it.
  const uint64_t chunk_size = direct ? 4ull << 20 : 512ull << 10;
  const uint64_t chunks = (data_size + chunk_size - 1) / chunk_size;
  const int generators =
      static_cast<int>(std::min<uint64_t>(std::max(threads, 1), std::max<uint64_t>(chunks, 1)));
  std::vector<AlignedBuffer> buffers;
  for (int i = 0; i < std::min(2 * generators + 1, 64); ++i) {
    buffers.emplace_back(std::min(chunk_size, (data_size + kPage - 1) / kPage * kPage));
  }
  std::vector<int> free_buffers(buffers.size());
  std::iota(free_buffers.begin(), free_buffers.end(), 0);
  std::deque<std::pair<uint64_t, int>> ready;  // (chunk, buffer)
  std::mutex mu;
  std::condition_variable changed;
  int running = generators;
  bool failed = false;
  std::atomic<uint64_t> next{0};
  // Tensors are packed back to back (no gaps allowed), so a chunk can cut an element when an
  // earlier tensor's size is not a multiple of this one's element: such an element is made
  // whole in `one` and its bytes in range copied, so `fill` only sees whole elements.
  auto fill_range = [&](size_t t, uint64_t from, uint64_t n, uint8_t* out) {
    const uint64_t elem = DTypeSize(tensors[t].dtype), end = from + n;
    uint8_t one[16];
    uint64_t at = from;
    if (at % elem != 0) {
      const uint64_t first = at / elem * elem, take = std::min(end, first + elem) - at;
      fill(t, first, elem, one);
      std::memcpy(out, one + (at - first), take);
      at += take;
    }
    const uint64_t whole_end = std::max(at, end / elem * elem);
    if (whole_end > at) fill(t, at, whole_end - at, out + (at - from));
    at = whole_end;
    if (at < end) {
      fill(t, at, elem, one);
      std::memcpy(out + (at - from), one, end - at);
    }
  };
  auto generate = [&] {
    for (uint64_t c = next++; c < chunks; c = next++) {
      int b;
      {
        std::unique_lock<std::mutex> lock(mu);
        changed.wait(lock, [&] { return !free_buffers.empty() || failed; });
        if (failed) break;
        b = free_buffers.back();
        free_buffers.pop_back();
      }
      const uint64_t begin = c * chunk_size, end = std::min(data_size, begin + chunk_size);
      // The first tensor that ends after `begin`, then every tensor up to `end`.
      size_t t = std::upper_bound(offsets.begin(), offsets.end(), begin) - offsets.begin() - 1;
      for (uint64_t at = begin; at < end; ++t) {
        const uint64_t stop = std::min(end, offsets[t + 1]);
        if (stop > at) fill_range(t, at - offsets[t], stop - at, buffers[b].data + (at - begin));
        at = stop;
      }
      std::lock_guard<std::mutex> lock(mu);
      ready.emplace_back(c, b);
      changed.notify_all();
    }
    std::lock_guard<std::mutex> lock(mu);
    --running;
    changed.notify_all();
  };
  std::vector<std::thread> pool;
  for (int i = 0; i < generators; ++i) pool.emplace_back(generate);
  absl::Status error;
  for (;;) {
    std::pair<uint64_t, int> item;
    {
      std::unique_lock<std::mutex> lock(mu);
      changed.wait(lock, [&] { return !ready.empty() || running == 0; });
      if (ready.empty()) break;
      item = ready.front();
      ready.pop_front();
    }
    const uint64_t begin = item.first * chunk_size;
    uint64_t size = std::min(data_size, begin + chunk_size) - begin;
    if (direct && size % kPage != 0) {  // the last chunk: whole pages, cut back below
      const uint64_t padded = (size + kPage - 1) / kPage * kPage;
      std::memset(buffers[item.second].data + size, 0, padded - size);
      size = padded;
    }
    if (error.ok())
      error = PwriteAll(fd, buffers[item.second].data, size, data_begin + begin, name);
    std::lock_guard<std::mutex> lock(mu);
    failed = !error.ok();
    free_buffers.push_back(item.second);
    changed.notify_all();
  }
  for (std::thread& th : pool) th.join();
  RETURN_IF_ERROR(error);
  if (direct && ::ftruncate(fd, static_cast<off_t>(file_size)) != 0) {
    return absl::InternalError(absl::StrCat(name, ": ", std::strerror(errno)));
  }
  if (::close(std::exchange(closer.fd, -1)) != 0)
    return absl::InternalError(absl::StrCat(name, ": ", std::strerror(errno)));
  return absl::OkStatus();
}

}  // namespace strata
