// libFuzzer entry point for the safetensors header parser:
//   cmake -B build-fuzz -DCMAKE_CXX_COMPILER=clang++ -DSTRATA_FUZZ=ON && ninja -C build-fuzz
//   safetensors_fuzzer build-fuzz/bin/safetensors_fuzzer -max_total_time=60
#include <cstddef>
#include <cstdint>

#include "common/model/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto result = strata::ParseSafetensors(absl::Span<const uint8_t>(data, size), "fuzz");
  if (result.ok()) {
    for (const auto& e : *result) {
      if (e.begin > e.end || e.end > size) __builtin_trap();
    }
  }
  return 0;
}
