// The reference models in tests/data/oracles (see its README.md).
#ifndef STRATA_TESTS_TESTING_ORACLES_H_
#define STRATA_TESTS_TESTING_ORACLES_H_

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

namespace strata::testing {

// Folder names of every oracle model, sorted.
inline std::vector<std::string> OracleNames() {
  namespace fs = std::filesystem;
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(fs::path(STRATA_TEST_DATA_DIR) / "oracles")) {
    if (fs::exists(entry.path() / "oracle.json")) names.push_back(entry.path().filename());
  }
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace strata::testing

#endif  // STRATA_TESTS_TESTING_ORACLES_H_
