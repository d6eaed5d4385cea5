#include "common/util/tunables.h"

#include <cstdlib>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "common/util/process.h"

namespace strata {
namespace {

// One switch: its variable, the value that turns it on and the one that leaves the default.
absl::Status ReadSwitch(const std::function<const char*(const char*)>& lookup, const char* name,
                        absl::string_view on, absl::string_view off, bool& value) {
  const char* set = lookup(name);
  if (set == nullptr || *set == 0) return absl::OkStatus();
  if (set == on) {
    value = true;
  } else if (set == off) {
    value = false;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat(name, "=\"", set, "\": use ", on, " or ", off, " (or leave it unset)"));
  }
  return absl::OkStatus();
}

Tunables& Current() {
  static Tunables* tunables = [] {
    auto parsed = ParseTunables([](const char* name) { return std::getenv(name); });
    return new Tunables(parsed.ok() ? *parsed : Tunables());
  }();
  return *tunables;
}

}  // namespace

absl::StatusOr<Tunables> ParseTunables(const std::function<const char*(const char*)>& lookup) {
  Tunables t;
  bool cuda_cores = false;
  if (absl::Status s = ReadSwitch(lookup, "STRATA_MMA_EXPERTS", "0", "1", cuda_cores); !s.ok()) {
    return s;
  }
  t.tensor_core_experts = !cuda_cores;
  if (absl::Status s = ReadSwitch(lookup, "STRATA_FLAG_WAIT", "memop", "poll", t.flag_wait_memop);
      !s.ok()) {
    return s;
  }
  if (absl::Status s =
          ReadSwitch(lookup, "STRATA_SIGNAL_SCOPE", "system", "device", t.system_scope_signals);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = ReadSwitch(lookup, "STRATA_FP8_GEMM", "tensor-cores", "dequantize",
                                  t.fp8_tensor_core_gemm);
      !s.ok()) {
    return s;
  }
  if (absl::Status s =
          ReadSwitch(lookup, "STRATA_NUCLEUS", "draw-first", "radix", t.nucleus_draw_first);
      !s.ok()) {
    return s;
  }
  if (const char* dir = lookup("STRATA_GPU_CLOCK_STAMPS"); dir != nullptr) {
    t.gpu_clock_stamps = dir;
  }
  if (const char* trials = lookup("STRATA_STEP_TRIALS"); trials != nullptr && *trials != 0) {
    const absl::string_view v = trials;
    if (v == "off") {
      t.step_trials = Tunables::StepTrials::kOff;
    } else if (v == "always") {
      t.step_trials = Tunables::StepTrials::kAlways;
    } else if (v != "auto") {
      return absl::InvalidArgumentError(absl::StrCat(
          "STRATA_STEP_TRIALS=\"", v, "\": use off, auto or always (or leave it unset)"));
    }
  }
  return t;
}

const Tunables& GetTunables() { return Current(); }

absl::StatusOr<Tunables> LoadTunables() {
  auto parsed = ParseTunables([](const char* name) { return std::getenv(name); });
  if (!parsed.ok()) return parsed.status();
  Current() = *parsed;
  return *parsed;
}

absl::StatusOr<Tunables> LoadAndLogTunables() {
  absl::StatusOr<Tunables> loaded = LoadTunables();
  if (!loaded.ok()) return loaded;
  const std::string described = absl::StrCat("tunables: ", DescribeTunables(*loaded));
  if (*loaded == Tunables()) {
    Log(LogLevel::kInfo, described);
  } else {
    StatusLine(described);
  }
  return loaded;
}

std::string DescribeTunables(const Tunables& t) {
  std::vector<std::string> changed;
  const Tunables d;
  if (t.tensor_core_experts != d.tensor_core_experts) changed.push_back("STRATA_MMA_EXPERTS=0");
  if (t.flag_wait_memop != d.flag_wait_memop) changed.push_back("STRATA_FLAG_WAIT=memop");
  if (t.system_scope_signals != d.system_scope_signals) {
    changed.push_back("STRATA_SIGNAL_SCOPE=system");
  }
  if (t.gpu_clock_stamps != d.gpu_clock_stamps) {
    changed.push_back(absl::StrCat("STRATA_GPU_CLOCK_STAMPS=", t.gpu_clock_stamps));
  }
  if (t.step_trials != d.step_trials) {
    changed.push_back(t.step_trials == Tunables::StepTrials::kOff ? "STRATA_STEP_TRIALS=off"
                                                                  : "STRATA_STEP_TRIALS=always");
  }
  if (t.fp8_tensor_core_gemm != d.fp8_tensor_core_gemm) {
    changed.push_back(t.fp8_tensor_core_gemm ? "STRATA_FP8_GEMM=tensor-cores"
                                             : "STRATA_FP8_GEMM=dequantize");
  }
  if (t.nucleus_draw_first != d.nucleus_draw_first) {
    changed.push_back(t.nucleus_draw_first ? "STRATA_NUCLEUS=draw-first" : "STRATA_NUCLEUS=radix");
  }
  return changed.empty() ? "defaults" : absl::StrJoin(changed, " ");
}

void SetTunablesForTest(const Tunables& tunables) { Current() = tunables; }

}  // namespace strata
