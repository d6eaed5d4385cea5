// The `strata` command as a user runs it: JSON on stdout, errors on stderr with a non-zero exit.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/oracles.h"
#include "tests/testing/run_strata.h"
#include "tools/strata/cluster_config.h"

namespace strata {
namespace {

using ::testing::HasSubstr;

using ::strata::testing::RunStrata;
using Result = ::strata::testing::CommandResult;

const std::string kModel = ::strata::testing::OracleDir("qwen3_moe");

nlohmann::json Oracle() { return ::strata::testing::LoadOracle("qwen3_moe"); }

std::string Join(const std::vector<int>& ids) {
  std::string s;
  for (size_t i = 0; i < ids.size(); ++i) absl::StrAppend(&s, i ? "," : "", ids[i]);
  return s;
}

// Every config-file key with a flag names one `strata up` defines (the table and main's flags
// are written apart).
TEST(StrataCliTest, UpHelpListsEveryConfigKeysFlag) {
  const Result r = RunStrata("up --help");
  EXPECT_EQ(r.exit_code, 0) << r.out;
  const std::vector<std::string> flags = ClusterConfigFlags();
  EXPECT_GE(flags.size(), 20u);
  for (const std::string& flag : flags) EXPECT_THAT(r.out, HasSubstr("--" + flag + "  ")) << flag;
  const Result bad = RunStrata("up --model /m --kv-cache-megabytes 4");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_THAT(bad.out, HasSubstr("unknown flag --kv-cache-megabytes"));
}

TEST(StrataCliTest, LogitsPrintsOneRowPerPosition) {
  const auto c = Oracle()["cases"][0];
  const Result r = RunStrata("logits --model " + kModel + " --ids " + Join(c["all_ids"]));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const auto json = nlohmann::json::parse(r.out);
  ASSERT_EQ(json["logits"].size(), c["all_ids"].size());
  EXPECT_EQ(json["logits"][0].size(), 512u);
  EXPECT_NEAR(json["logits"][3][7].get<double>(), c["logits"][3][7].get<double>(), 1e-3);
}

TEST(StrataCliTest, GenerateGreedyMatchesOracle) {
  const auto c = Oracle()["cases"][1];
  const Result r = RunStrata("generate --model " + kModel + " --ids " + Join(c["prompt"]) +
                             " --max-new-tokens 16");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(nlohmann::json::parse(r.out)["token_ids"], c["greedy"]);
}

TEST(StrataCliTest, SeededSamplingRepeats) {
  const std::string args =
      "generate --model " + kModel +
      " --ids 1,2,3 --max-new-tokens 8 --temperature 1.5 --top-p 0.95 --seed 5";
  const Result a = RunStrata(args);
  const Result b = RunStrata(args);
  ASSERT_EQ(a.exit_code, 0) << a.out;
  EXPECT_EQ(a.out, b.out);
  EXPECT_EQ(nlohmann::json::parse(a.out)["token_ids"].size(), 8u);
}

TEST(StrataCliTest, Errors) {
  struct Case {
    std::string args;
    std::string message;
  };
  const Case cases[] = {
      {"logits --ids 1,2", "--model is required"},
      {"logits --model /nonexistent --ids 1", "/nonexistent/config.json"},
      {"logits --model " + kModel + " --ids 1,x", "\"x\" is not a non-negative token id"},
      {"logits --model " + kModel + " --ids 1,512", "token id 512 at position 1 is outside"},
      {"logits --model " + kModel + " --ids ''", "--ids is empty"},
      {"generate --model " + kModel + " --ids 1 --max-new-tokens 0", "max_new_tokens"},
      {"generate --model " + kModel + " --ids 1 --max-new-tokens 5000",
       "exceed the 2048-token context"},
      {"generate --model " + kModel + " --ids 1 --temperature -1",
       "'temperature' must be in [0, 2]"},
      {"generate --model " + kModel + " --ids 1 --gate-temperature 0", "gate_temperature"},
      {"generate --model " + kModel + " --ids 1 --router-temperature 0", "gate_temperature"},
      {"frobnicate --model " + kModel, "unknown command"},
      {"generate --model " + kModel + " --ids 1 --stop x", "--stop needs --server"},
      {"generate --model " + kModel, "--prompt or --ids is required"},
      {"generate --model " + kModel + " --prompt hi", "--prompt needs the model's tokenizer"},
      // strata up checks its flags (and cluster.yaml) before starting any process.
      {"up --model " + kModel + " --cache-policy mru",
       "bad value for \"cache_policy\" (--cache-policy): must be one of lru, lfu"},
      {"up --model " + kModel + " --transport carrier-pigeon", "(--transport)"},
      {"up --model " + kModel + " --hot-ratio 2", "(--hot-ratio)"},
      {"up --model " + kModel + " --device tpu", "(--device)"},
      {"up --model " + kModel + " --router-device cuda:0", "needs workers on GPUs"},
      {"up --model " + kModel + " --kv-cache-dtype int4",
       "kv cache dtype \"int4\" is not one of auto, bf16, fp8"},
      {"up --model " + kModel + " --speculative-tokens 40", "(--speculative-tokens)"},
      {"eval --model " + kModel + " --text /dev/null --kv-cache-dtype fp4",
       "is not one of auto, bf16, fp8"},
      {"kv-resize --kv-blocks 10", "give --server HOST:PORT"},
      {"stats --server 127.0.0.1:1", "no cluster of this user serves 127.0.0.1:1"},
  };
  for (const Case& c : cases) {
    const Result r = RunStrata(c.args);
    EXPECT_NE(r.exit_code, 0) << c.args;
    EXPECT_THAT(r.out, HasSubstr(c.message)) << c.args;
  }
}

// `strata --help` lists the commands; `strata <command> --help` its flags, dashed, with defaults.
TEST(StrataCliTest, HelpOfEveryCommand) {
  const Result all = RunStrata("--help");
  EXPECT_EQ(all.exit_code, 0) << all.out;
  const char* commands[] = {"generate",  "up",   "logits",     "eval",     "bench",    "stats",
                            "hot-ratio", "plan", "make-model", "quantize", "kv-resize"};
  for (const char* command : commands) {
    EXPECT_THAT(all.out, HasSubstr(absl::StrCat("  ", command, " "))) << command;
    const Result r = RunStrata(absl::StrCat(command, " --help"));
    EXPECT_EQ(r.exit_code, 0) << command << ": " << r.out;
    EXPECT_THAT(r.out, ::testing::StartsWith(absl::StrCat("strata ", command, " "))) << r.out;
    EXPECT_THAT(r.out, ::testing::Not(::testing::ContainsRegex("--[a-z]+_[a-z]"))) << r.out;
  }
  const Result generate = RunStrata("generate --help");
  EXPECT_THAT(generate.out, HasSubstr("  --max-new-tokens  Tokens to generate (default 16)\n"));
  EXPECT_THAT(generate.out, HasSubstr("  --stop  "));
  EXPECT_THAT(generate.out, HasSubstr("[finish: REASON]"));
  EXPECT_THAT(RunStrata("bench --help").out, HasSubstr("  --output-len  "));
}

// "  --name  help (default ...)" lines of a help page: name -> help.
std::map<std::string, std::string> FlagLines(const std::string& page) {
  std::map<std::string, std::string> flags;
  for (absl::string_view line : absl::StrSplit(page, '\n')) {
    if (!absl::ConsumePrefix(&line, "  --")) continue;
    const size_t gap = line.find("  ");
    if (gap == absl::string_view::npos) continue;
    const bool added = flags.emplace(line.substr(0, gap), line.substr(gap + 2)).second;
    EXPECT_TRUE(added) << "listed twice: " << line;
  }
  return flags;
}

// Whether `help` addresses `command` the way a page shared by commands would ("bench: ...",
// "plan, quantize: ...") or names it as `strata <command>`.
bool NamesCommand(const std::string& help, const std::string& command) {
  if (absl::StrContains(help, "strata " + command)) return true;
  for (size_t at = help.find(command); at != std::string::npos; at = help.find(command, at + 1)) {
    const size_t end = at + command.size();
    const bool word_start = at == 0 || !(absl::ascii_isalnum(help[at - 1]) || help[at - 1] == '-');
    if (word_start && end < help.size() && (help[end] == ':' || help[end] == ',')) return true;
  }
  return false;
}

// The commands share one set of flags: each command's help lists exactly the flags it takes,
// and what it says of each is about that command (quantize's --out is its model directory, not
// bench's results file).
TEST(StrataCliTest, EachCommandsHelpIsItsOwn) {
  const std::vector<std::string> engine = {"device",
                                           "weights",
                                           "threads",
                                           "kv-block-size",
                                           "kv-cache-mb",
                                           "kv-cache-dtype",
                                           "kv-cache-fp16-above-tokens",
                                           "kv-cache-calibration-tokens",
                                           "prefill-chunk",
                                           "gate-temperature",
                                           "router-temperature",
                                           "log-level"};
  auto with_engine = [&](std::vector<std::string> flags) {
    flags.insert(flags.end(), engine.begin(), engine.end());
    return flags;
  };
  const std::map<std::string, std::vector<std::string>> expected = {
      {"generate", with_engine({"server", "model", "prompt", "ids", "max-new-tokens", "temperature",
                                "top-k", "top-p", "seed", "stop", "stream", "ignore-eos", "min-p",
                                "repetition-penalty", "presence-penalty", "frequency-penalty",
                                "logit-bias", "min-tokens", "stop-token-ids"})},
      {"logits", with_engine({"model", "ids"})},
      {"eval", with_engine({"model", "text", "server", "window", "expert-stats", "hit-rates"})},
      {"bench",
       {"server",
        "admin",
        "cluster-token-file",
        "input-len",
        "shared-prefix",
        "prompts",
        "output-len",
        "runs",
        "warmup",
        "concurrency",
        "seed",
        "temperature",
        "top-k",
        "top-p",
        "min-p",
        "repetition-penalty",
        "out",
        "model",
        "model-name",
        "weights",
        "mode",
        "gpus",
        "machine",
        "commit",
        "note",
        "peak-tflops",
        "interfering-prompt-len",
        "interfering-after-s",
        "log-level"}},
      {"stats", {"server", "admin", "cluster-token-file", "log-level"}},
      {"hot-ratio", {"server", "admin", "cluster-token-file", "hot-ratio", "log-level"}},
      {"kv-resize", {"server", "admin", "cluster-token-file", "kv-blocks", "log-level"}},
      {"plan", with_engine({"model", "calibration", "workers", "out"})},
      {"make-model",
       {"shape", "out", "dtype", "fp8-scaling", "skew", "seed", "layers", "force", "threads",
        "log-level"}},
      {"quantize", with_engine({"model", "out", "fp8-scaling", "calibration", "samples",
                                "kv-scales", "force"})},
  };
  std::map<std::string, std::map<std::string, std::string>> pages;
  for (const auto& [command, flags] : expected) {
    const Result r = RunStrata(command + " --help");
    ASSERT_EQ(r.exit_code, 0) << command << ": " << r.out;
    pages[command] = FlagLines(r.out);
    std::vector<std::string> listed;
    for (const auto& [flag, help] : pages[command]) listed.push_back(flag);
    EXPECT_THAT(listed, ::testing::UnorderedElementsAreArray(flags)) << command;
    for (const auto& [flag, help] : pages[command]) {
      for (const auto& [other, unused] : expected) {
        if (other != command) {
          EXPECT_FALSE(NamesCommand(help, other)) << command << " --" << flag << ": " << help;
        }
      }
      EXPECT_FALSE(NamesCommand(help, "up")) << command << " --" << flag << ": " << help;
    }
  }
  EXPECT_THAT(pages["quantize"]["out"], HasSubstr("quantized model"));
  EXPECT_THAT(pages["make-model"]["out"], HasSubstr("model directory"));
  EXPECT_THAT(pages["plan"]["out"], HasSubstr("plan file"));
  EXPECT_THAT(pages["bench"]["out"], HasSubstr("JSON results file"));
  EXPECT_THAT(pages["make-model"]["seed"], HasSubstr("random weights"));
  EXPECT_THAT(pages["stats"]["server"], ::testing::Not(HasSubstr("Generate")));
}

// strata-router and the strata tool take the engine's flags from one definition: the same
// help and default, true on the CPU and on a GPU alike.
TEST(StrataCliTest, EngineFlagsReadAlikeInBothPrograms) {
  const Result router =
      ::strata::testing::RunCommand(absl::StrCat(STRATA_BIN_DIR, "/strata-router --help"));
  ASSERT_EQ(router.exit_code, 0) << router.out;
  const auto router_flags = FlagLines(router.out);
  const auto tool_flags = FlagLines(RunStrata("generate --help").out);
  for (const char* flag :
       {"threads", "gate-temperature", "router-temperature", "kv-block-size", "kv-cache-mb",
        "kv-cache-dtype", "kv-cache-fp16-above-tokens", "kv-cache-calibration-tokens"}) {
    ASSERT_TRUE(router_flags.contains(flag)) << flag;
    ASSERT_TRUE(tool_flags.contains(flag)) << flag;
    EXPECT_EQ(router_flags.at(flag), tool_flags.at(flag)) << flag;
  }
  EXPECT_THAT(tool_flags.at("kv-block-size"), ::testing::EndsWith("(default 32)"));
  EXPECT_THAT(tool_flags.at("kv-cache-dtype"), HasSubstr("float32 on the CPU, bf16 on a GPU"));
  EXPECT_THAT(router_flags.at("prefix-caching"), ::testing::EndsWith("(default true)"));
}

TEST(StrataCliTest, UnknownFlagNamesTheNearest) {
  const Result r = RunStrata("generate --model " + kModel + " --ids 1 --max-new-token 3");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.out, HasSubstr("unknown flag --max-new-token; did you mean --max-new-tokens?"));
  const Result up = RunStrata("up --model " + kModel + " --wokers 2");
  EXPECT_NE(up.exit_code, 0);
  EXPECT_THAT(up.out, HasSubstr("did you mean --workers?"));
}

// The daemons print their own usage with dashed flag names, without Abseil's warnings.
TEST(StrataCliTest, DaemonsHelpAndUnknownFlags) {
  const std::pair<const char*, const char*> daemons[] = {
      {"strata-router", "--kv-cache-mb"},
      {"strata-worker", "--gpu-memory-budget"},
      {"strata-expert-store", "--segment-prefix"}};
  for (const auto& [daemon, flag] : daemons) {
    const std::string bin = absl::StrCat(STRATA_BIN_DIR, "/", daemon);
    const Result r = ::strata::testing::RunCommand(bin + " --help");
    EXPECT_EQ(r.exit_code, 0) << r.out;
    EXPECT_THAT(r.out, ::testing::StartsWith(absl::StrCat(daemon, " --model DIR")));
    EXPECT_THAT(r.out, HasSubstr(absl::StrCat("  ", flag, "  ")));
    EXPECT_THAT(r.out, HasSubstr("  --log-level  debug, info, warning or error (default warning)"));
    EXPECT_THAT(r.out, ::testing::Not(HasSubstr("SetProgramUsageMessage")));
    EXPECT_THAT(r.out, ::testing::Not(::testing::ContainsRegex("--[a-z]+_[a-z]"))) << r.out;
    const Result bad = ::strata::testing::RunCommand(bin + " --modle /m");
    EXPECT_EQ(bad.exit_code, 2);
    EXPECT_THAT(bad.out, HasSubstr(absl::StrCat(daemon,
                                                ": unknown flag --modle; did you mean "
                                                "--model?")));
  }
}

// The HTTP API's flags, on strata-router and `strata up` alike; a bad key is refused at start
// without being repeated.
TEST(StrataCliTest, HttpApiFlags) {
  const std::string router = absl::StrCat(STRATA_BIN_DIR, "/strata-router");
  const Result help = ::strata::testing::RunCommand(router + " --help");
  const auto router_flags = FlagLines(help.out);
  const auto up_flags = FlagLines(RunStrata("up --help").out);
  for (const char* flag : {"served-model-name", "api-key"}) {
    ASSERT_TRUE(router_flags.contains(flag)) << flag;
    ASSERT_TRUE(up_flags.contains(flag)) << flag;
  }
  EXPECT_THAT(router_flags.at("api-key"), HasSubstr("$STRATA_API_KEY"));
  EXPECT_THAT(up_flags.at("api-key"), HasSubstr("(config: api_key)"));
  EXPECT_THAT(up_flags.at("served-model-name"), HasSubstr("/v1/models"));
  const Result bad = ::strata::testing::RunCommand(router + " --model /m --api-key 'sk bad'");
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_THAT(bad.out, HasSubstr("the API key (--api-key or $STRATA_API_KEY) must be"));
  EXPECT_THAT(bad.out, ::testing::Not(HasSubstr("sk bad")));
  const Result up = RunStrata("up --model /m --api-key 'sk bad'");
  EXPECT_NE(up.exit_code, 0);
  EXPECT_THAT(up.out, HasSubstr("(--api-key): must be"));
  EXPECT_THAT(up.out, ::testing::Not(HasSubstr("sk bad")));
}

// A port another server holds: the router says so, and `strata up` stops what it started.
TEST(StrataCliTest, UpOnAPortInUseFails) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(::listen(fd, 4), 0);
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  const int port = ntohs(addr.sin_port);
  const Result r = RunStrata(absl::StrCat("up --model ", kModel, " --threads 1 --port ", port));
  ::close(fd);
  EXPECT_NE(r.exit_code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr(absl::StrCat("strata-router: cannot listen on 127.0.0.1:", port,
                                            ": port in use")));
  EXPECT_THAT(r.out, ::testing::Not(HasSubstr("READY")));
}

// In process, a prompt in text and the text out, with the model's tokenizer.
TEST(StrataCliTest, GenerateInProcessFromAPrompt) {
  const Result r = RunStrata(absl::StrCat("generate --model ", STRATA_SOURCE_DIR,
                                          "/models/strata-demo --prompt 'In the beginning' "
                                          "--max-new-tokens 8 --threads 2"));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const auto json = nlohmann::json::parse(r.out);
  EXPECT_EQ(json["token_ids"].size(), 8u);
  EXPECT_FALSE(json["text"].get<std::string>().empty());
}

}  // namespace
}  // namespace strata
