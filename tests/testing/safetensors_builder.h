// Builds safetensors files in memory for tests: well-formed ones from a list of tensors, and
// arbitrary headers for the error paths.
#ifndef STRATA_TESTS_TESTING_SAFETENSORS_BUILDER_H_
#define STRATA_TESTS_TESTING_SAFETENSORS_BUILDER_H_

#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"

namespace strata::testing {

class SafetensorsBuilder {
 public:
  // Adds a tensor whose bytes are `bytes` (dtype and shape as written in the header).
  SafetensorsBuilder& Add(const std::string& name, const std::string& dtype,
                          std::vector<int64_t> shape, std::vector<uint8_t> bytes) {
    tensors_.push_back({name, dtype, std::move(shape), std::move(bytes)});
    return *this;
  }

  // Adds a BF16 tensor with values start, start + step, ... (exact in bf16 for small ints).
  SafetensorsBuilder& AddBf16(const std::string& name, std::vector<int64_t> shape,
                              float start = 0.0f, float step = 1.0f) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::vector<uint8_t> bytes(n * 2);
    for (int64_t i = 0; i < n; ++i) {
      const float v = start + step * static_cast<float>(i);
      uint32_t bits;
      std::memcpy(&bits, &v, 4);
      const uint16_t bf = static_cast<uint16_t>(bits >> 16);
      std::memcpy(bytes.data() + 2 * i, &bf, 2);
    }
    return Add(name, "BF16", std::move(shape), std::move(bytes));
  }

  nlohmann::json Header() const {
    nlohmann::json header = {{"__metadata__", {{"format", "pt"}}}};
    uint64_t offset = 0;
    for (const auto& t : tensors_) {
      header[t.name] = {{"dtype", t.dtype},
                        {"shape", t.shape},
                        {"data_offsets", {offset, offset + t.bytes.size()}}};
      offset += t.bytes.size();
    }
    return header;
  }

  std::string Build() const { return Assemble(Header().dump(), Data()); }

  std::string Data() const {
    std::string data;
    for (const auto& t : tensors_) data.append(t.bytes.begin(), t.bytes.end());
    return data;
  }

  // A file from a raw header text and data bytes, the header padded to 8 bytes as the
  // reference writer does.
  static std::string Assemble(std::string header, const std::string& data) {
    while (header.size() % 8 != 0) header.push_back(' ');
    std::string file(8, '\0');
    uint64_t len = header.size();
    for (int i = 0; i < 8; ++i) file[i] = static_cast<char>((len >> (8 * i)) & 0xff);
    return file + header + data;
  }

  static void WriteFile(const std::string& path, const std::string& bytes) {
    std::ofstream out(path, std::ios::binary);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }

 private:
  struct Entry {
    std::string name;
    std::string dtype;
    std::vector<int64_t> shape;
    std::vector<uint8_t> bytes;
  };
  std::vector<Entry> tensors_;
};

}  // namespace strata::testing

#endif  // STRATA_TESTS_TESTING_SAFETENSORS_BUILDER_H_
