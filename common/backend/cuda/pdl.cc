#include "common/backend/cuda/pdl.h"

#include <cstdlib>
#include <cstring>

namespace strata::gpu {

bool ProgrammaticLaunch() {
  static const bool on = [] {
    const char* value = std::getenv("STRATA_PDL");
    return value == nullptr || std::strcmp(value, "0") != 0;
  }();
  return on;
}

}  // namespace strata::gpu
