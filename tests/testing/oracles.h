// The reference models in tests/data/oracles (see its README.md).
#ifndef STRATA_TESTS_TESTING_ORACLES_H_
#define STRATA_TESTS_TESTING_ORACLES_H_

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"

namespace strata::testing {

// The folder of the oracle model `name`.
inline std::string OracleDir(const std::string& name) {
  return std::string(STRATA_TEST_DATA_DIR) + "/oracles/" + name;
}

// Its oracle.json: the reference "cases" (prompt, greedy, all_ids, logits).
inline nlohmann::json LoadOracle(const std::string& name) {
  std::ifstream in(std::filesystem::path(OracleDir(name)) / "oracle.json");
  return nlohmann::json::parse(in);
}

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
