// ForcedCallGrammar's structural tags compiled by xgrammar: each accepts, after its format's
// forced start, what the model's chat template writes for calls, and ends there.
#include <variant>

#include "common/chat/tool_call_parser.h"
#include "gtest/gtest.h"
#include "xgrammar/xgrammar.h"

namespace strata {
namespace {

using Json = nlohmann::ordered_json;

constexpr int32_t kEnd = 1;  // the end-of-sequence token of the vocabulary below

// Whether the grammar of `format` takes `text` after the start ForcedCallPrefix wrote, then the
// end of the reply. The vocabulary is a raw one: the text is matched byte by byte.
bool Takes(ToolCallFormat format, const std::optional<std::string>& function, bool parallel,
           const std::string& text) {
  static const Json tools = Json::parse(R"([
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
     "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
     "required": ["city"]}}},
    {"type": "function", "function": {"name": "now"}}])");
  const xgrammar::TokenizerInfo vocabulary(std::vector<std::string>{"a", "</s>"},
                                           xgrammar::VocabType::RAW, std::nullopt,
                                           std::vector<int32_t>{kEnd});
  xgrammar::GrammarCompiler compiler(vocabulary, 1, false);
  const std::optional<std::string> tag = ForcedCallGrammar(format, tools, function, parallel);
  EXPECT_TRUE(tag.has_value());
  if (!tag.has_value()) return false;
  auto grammar = xgrammar::Grammar::FromStructuralTag(*tag);
  EXPECT_TRUE(std::holds_alternative<xgrammar::Grammar>(grammar)) << *tag;
  if (!std::holds_alternative<xgrammar::Grammar>(grammar)) return false;
  xgrammar::GrammarMatcher matcher(compiler.CompileGrammar(std::get<xgrammar::Grammar>(grammar)));
  return matcher.AcceptString(text) && matcher.AcceptToken(kEnd);
}

struct Reply {
  ToolCallFormat format;
  std::optional<std::string> function;  // named, or "required"
  bool parallel;
  const char* text;  // after the forced start
  bool taken;
};

TEST(ForcedCallGrammarTest, TakesWhatTheTemplatesWrite) {
  const Reply replies[] = {
      // GLM: pairs on their lines, the end on its own; a call without arguments; the schema's
      // required argument missing.
      {ToolCallFormat::kGlm45, "get_weather", false,
       "<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n<arg_key>days</arg_key>\n"
       "<arg_value>2</arg_value>\n</tool_call>",
       true},
      {ToolCallFormat::kGlm45, std::nullopt, true,
       "get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n</tool_call>\n"
       "<tool_call>now\n</tool_call>",
       true},
      {ToolCallFormat::kGlm45, "get_weather", false,
       "<arg_key>days</arg_key>\n<arg_value>2</arg_value>\n</tool_call>", false},
      {ToolCallFormat::kDeepSeekV3, std::nullopt, true,
       "get_weather\n```json\n{\"city\": \"Paris\"}\n```<｜tool▁call▁end｜>\n"
       "<｜tool▁call▁begin｜>function<｜tool▁sep｜>now\n```json\n{}\n```<｜tool▁call▁end｜>"
       "<｜tool▁calls▁end｜>",
       true},
      // DeepSeek-V3.1: the section must be closed.
      {ToolCallFormat::kDeepSeekV31, "get_weather", false,
       "{\"city\": \"Paris\", \"days\": 2}<｜tool▁call▁end｜><｜tool▁calls▁end｜>", true},
      {ToolCallFormat::kDeepSeekV31, "get_weather", false,
       "{\"city\": \"Paris\"}<｜tool▁call▁end｜>", false},
      {ToolCallFormat::kKimiK2, "get_weather", false,
       "12<|tool_call_argument_begin|>{\"city\": \"Paris\"}<|tool_call_end|>"
       "<|tool_calls_section_end|>",
       true},
      {ToolCallFormat::kHermes, std::nullopt, true,
       "{\"name\": \"now\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n{\"name\": \"now\", "
       "\"arguments\": {}}\n</tool_call>",
       true},
  };
  for (const Reply& r : replies) {
    EXPECT_EQ(Takes(r.format, r.function, r.parallel, r.text), r.taken)
        << ToolCallFormatName(r.format) << ": " << r.text;
  }
}

}  // namespace
}  // namespace strata
