#include "common/chat/tool_call_parser.h"

#include <random>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace strata {
namespace {

// A reply's pieces as one string: text as is, calls as [name|arguments].
std::string Show(const std::vector<ReplyPiece>& pieces) {
  std::string out;
  for (const ReplyPiece& p : pieces) {
    out += p.call.has_value() ? "[" + p.call->name + "|" + p.call->arguments + "]" : p.text;
  }
  return out;
}

std::string ParseWhole(absl::string_view reply) {
  return Show(ParseToolCalls(ToolCallFormat::kHermes, reply));
}

// The reply fed in pieces cut at `cuts` (byte offsets, ascending).
std::vector<ReplyPiece> ParseInPieces(absl::string_view reply, const std::vector<size_t>& cuts) {
  std::unique_ptr<ToolCallParser> parser = NewToolCallParser(ToolCallFormat::kHermes);
  std::vector<ReplyPiece> out;
  size_t at = 0;
  for (size_t cut : cuts) {
    for (ReplyPiece& p : parser->Feed(reply.substr(at, cut - at))) out.push_back(std::move(p));
    at = cut;
  }
  for (ReplyPiece& p : parser->Feed(reply.substr(at))) out.push_back(std::move(p));
  for (ReplyPiece& p : parser->Finish()) out.push_back(std::move(p));
  return out;
}

constexpr absl::string_view kTwoCalls =
    "I will check both.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
    "{\"city\": \"Paris\", \"days\": 2}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", "
    "\"arguments\": {\"zone\": \"Europe/Paris\"}}\n</tool_call>";

TEST(ToolCallParserTest, TextAroundSeveralCalls) {
  const std::vector<ReplyPiece> pieces = ParseToolCalls(ToolCallFormat::kHermes, kTwoCalls);
  ASSERT_EQ(pieces.size(), 3u);
  EXPECT_EQ(pieces[0].text, "I will check both.");
  ASSERT_TRUE(pieces[1].call.has_value());
  EXPECT_EQ(pieces[1].call->name, "get_weather");
  EXPECT_EQ(pieces[1].call->arguments, "{\"city\": \"Paris\", \"days\": 2}");
  ASSERT_TRUE(pieces[2].call.has_value());
  EXPECT_EQ(pieces[2].call->name, "get_time");
  EXPECT_EQ(pieces[2].call->arguments, "{\"zone\": \"Europe/Paris\"}");
}

TEST(ToolCallParserTest, PlainTextIsLeftAlone) {
  EXPECT_EQ(ParseWhole("no calls here, a < b and <tool> tags"),
            "no calls here, a < b and <tool> tags");
  EXPECT_EQ(ParseWhole("ends with a partial tag <tool_ca"), "ends with a partial tag <tool_ca");
  EXPECT_EQ(ParseWhole("  \n"), "  \n");
  EXPECT_EQ(ParseWhole(""), "");
}

TEST(ToolCallParserTest, TextAfterACallStays) {
  EXPECT_EQ(ParseWhole("<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>\n\nDone."),
            "[f|{}]Done.");
}

TEST(ToolCallParserTest, ArgumentsForms) {
  // A string is kept as the model wrote it; no arguments are an empty object; nested values
  // are written as json.dumps writes them.
  EXPECT_EQ(
      ParseWhole("<tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"a\\\":1}\"}</tool_call>"),
      "[f|{\"a\":1}]");
  EXPECT_EQ(ParseWhole("<tool_call>{\"name\": \"f\"}</tool_call>"), "[f|{}]");
  EXPECT_EQ(ParseWhole("<tool_call>{\"name\":\"f\",\"arguments\":{\"a\":[1,2.5,{\"b\":null}],"
                       "\"c\":true}}</tool_call>"),
            "[f|{\"a\": [1, 2.5, {\"b\": null}], \"c\": true}]");
}

TEST(ToolCallParserTest, MalformedBlocksStayText) {
  const std::string bad_json =
      "Before <tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": }\n"
      "</tool_call> after";
  EXPECT_EQ(ParseWhole(bad_json), bad_json);
  const std::string no_name = "<tool_call>{\"arguments\": {}}</tool_call>";
  EXPECT_EQ(ParseWhole(no_name), no_name);
  const std::string bad_arguments = "<tool_call>{\"name\": \"f\", \"arguments\": 3}</tool_call>";
  EXPECT_EQ(ParseWhole(bad_arguments), bad_arguments);
  const std::string a_list = "<tool_call>[1, 2]</tool_call>";
  EXPECT_EQ(ParseWhole(a_list), a_list);
  // A bad block among good ones: only it stays text.
  EXPECT_EQ(ParseWhole("<tool_call>{\"name\": \"f\"}</tool_call>\n<tool_call>oops</tool_call>\n"
                       "<tool_call>{\"name\": \"g\"}</tool_call>"),
            "[f|{}]<tool_call>oops</tool_call>[g|{}]");
}

TEST(ToolCallParserTest, AnUnclosedBlockAtTheEnd) {
  // A whole call whose closing tag never came (the model ended its turn) is a call ...
  EXPECT_EQ(ParseWhole("<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 1}}\n"),
            "[f|{\"x\": 1}]");
  // ... one cut short (max_tokens) is text.
  const std::string cut = "Sure. <tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 1";
  EXPECT_EQ(ParseWhole(cut), cut);
}

TEST(ToolCallParserTest, Unicode) {
  const std::vector<ReplyPiece> pieces = ParseToolCalls(
      ToolCallFormat::kHermes,
      "Météo à 東京 🌧\n<tool_call>\n{\"name\": \"météo\", \"arguments\": {\"ville\": "
      "\"東京\", \"emoji\": \"\\ud83c\\udf27\"}}\n</tool_call>");
  ASSERT_EQ(pieces.size(), 2u);
  EXPECT_EQ(pieces[0].text, "Météo à 東京 🌧");
  EXPECT_EQ(pieces[1].call->name, "météo");
  // Non-ASCII stays as UTF-8 (json.dumps with ensure_ascii=False).
  EXPECT_EQ(pieces[1].call->arguments, "{\"ville\": \"東京\", \"emoji\": \"🌧\"}");
}

TEST(ToolCallParserTest, TextIsHeldBackOnlyWhileItMayStartABlock) {
  std::unique_ptr<ToolCallParser> parser = NewToolCallParser(ToolCallFormat::kHermes);
  EXPECT_EQ(Show(parser->Feed("Hello <tool")), "Hello");
  EXPECT_EQ(Show(parser->Feed("box> there\n")), " <toolbox> there");
  EXPECT_EQ(Show(parser->Feed("<tool_call>{\"name\": \"f\"}")), "");
  EXPECT_EQ(Show(parser->Feed("</tool_call")), "");
  EXPECT_EQ(Show(parser->Feed(">")), "[f|{}]");
  EXPECT_EQ(Show(parser->Feed("\n\n")), "");
  EXPECT_EQ(Show(parser->Finish()), "");
}

TEST(ToolCallParserTest, ForcedPrefixStartsTheCall) {
  const std::string named = ForcedCallPrefix(ToolCallFormat::kHermes, "get_weather");
  EXPECT_EQ(named, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": ");
  EXPECT_EQ(ParseWhole(named + "{\"city\": \"Oslo\"}}\n</tool_call>"),
            "[get_weather|{\"city\": \"Oslo\"}]");
  EXPECT_EQ(ForcedCallPrefix(ToolCallFormat::kHermes, std::nullopt), "<tool_call>\n");
  EXPECT_EQ(ForcedCallPrefix(ToolCallFormat::kNone, std::nullopt), "");
}

TEST(ToolCallParserTest, ForcedCallGrammarHoldsTheCallToItsSchema) {
  const nlohmann::ordered_json tools = nlohmann::ordered_json::parse(R"([
    {"type": "function", "function": {"name": "f", "parameters": {"type": "object",
     "properties": {"x": {"type": "integer"}}}}},
    {"type": "function", "function": {"name": "g"}}])");
  EXPECT_FALSE(ForcedCallGrammar(ToolCallFormat::kNone, tools, std::nullopt, true).has_value());
  EXPECT_FALSE(ForcedCallGrammar(ToolCallFormat::kHermes, tools, "h", false).has_value());
  // Named: the prefix wrote the name; the arguments for f's schema, then the block's end.
  const auto named =
      nlohmann::json::parse(*ForcedCallGrammar(ToolCallFormat::kHermes, tools, "f", true));
  EXPECT_EQ(named["type"], "structural_tag");
  const auto& seq = named["format"]["elements"];
  ASSERT_EQ(seq.size(), 2u);
  EXPECT_EQ(seq[0]["json_schema"]["properties"]["x"]["type"], "integer");
  EXPECT_EQ(seq[0]["max_whitespace_cnt"], 1);
  EXPECT_EQ(seq[1]["value"], "}\n</tool_call>");
  // Required, one call: either function, its name written first; g takes any object.
  const auto one = nlohmann::json::parse(
      *ForcedCallGrammar(ToolCallFormat::kHermes, tools, std::nullopt, false));
  ASSERT_EQ(one["format"]["type"], "or");
  const auto& g = one["format"]["elements"][1]["elements"];
  EXPECT_EQ(g[0]["value"], "{\"name\": \"g\", \"arguments\": ");
  EXPECT_EQ(g[1]["json_schema"], nlohmann::json({{"type", "object"}}));
  // Parallel: later blocks open themselves.
  const auto many =
      nlohmann::json::parse(*ForcedCallGrammar(ToolCallFormat::kHermes, tools, std::nullopt, true));
  ASSERT_EQ(many["format"]["type"], "sequence");
  const auto& more = many["format"]["elements"][1];
  EXPECT_EQ(more["type"], "star");
  EXPECT_EQ(more["content"]["elements"][0]["value"], "\n<tool_call>\n");
}

// Every way of cutting the replies in two and three pieces gives what the whole reply gives.
TEST(ToolCallParserTest, ChunksSplitAnywhere) {
  const std::vector<std::string> replies = {
      std::string(kTwoCalls),
      "x <tool_call>{\"name\": \"f\", \"arguments\": {\"s\": \"</tool\"}}</tool_call> y <tool_ca",
      "é<tool_call>{\"name\": \"g\"}</tool_call>é<tool_call>bad</tool_call>  ",
      "<tool_call>\n{\"name\": \"h\", \"arguments\": {}}\n"};
  for (const std::string& reply : replies) {
    const std::string whole = ParseWhole(reply);
    for (size_t a = 0; a <= reply.size(); ++a) {
      ASSERT_EQ(Show(ParseInPieces(reply, {a})), whole) << reply << " cut at " << a;
    }
    std::mt19937 random(7);
    for (int trial = 0; trial < 300; ++trial) {
      size_t a = random() % (reply.size() + 1), b = random() % (reply.size() + 1);
      if (a > b) std::swap(a, b);
      ASSERT_EQ(Show(ParseInPieces(reply, {a, b})), whole) << reply << " cut at " << a << ", " << b;
    }
    // One byte at a time.
    std::vector<size_t> every;
    for (size_t i = 1; i < reply.size(); ++i) every.push_back(i);
    EXPECT_EQ(Show(ParseInPieces(reply, every)), whole) << reply;
  }
}

TEST(ToolCallFormatTest, ChosenFromTheTemplate) {
  const ChatTemplate plain;
  EXPECT_EQ(*ChooseToolCallFormat("auto", plain), ToolCallFormat::kHermes);
  auto hermes = ChatTemplate::FromSource(
      "{% for t in tools %}{{ t | tojson }}{% endfor %}<tool_call></tool_call>", "", "");
  ASSERT_TRUE(hermes.ok());
  EXPECT_EQ(*ChooseToolCallFormat("auto", *hermes), ToolCallFormat::kHermes);
  auto coder = ChatTemplate::FromSource("<tool_call>\n<function=name>", "", "");
  EXPECT_EQ(*ChooseToolCallFormat("auto", *coder), ToolCallFormat::kNone);
  auto none = ChatTemplate::FromSource("{{ messages[0].content }}", "", "");
  EXPECT_EQ(*ChooseToolCallFormat("auto", *none), ToolCallFormat::kNone);
  EXPECT_EQ(*ChooseToolCallFormat("hermes", *none), ToolCallFormat::kHermes);
  EXPECT_EQ(*ChooseToolCallFormat("none", plain), ToolCallFormat::kNone);
  EXPECT_FALSE(ChooseToolCallFormat("mistral", plain).ok());
}

}  // namespace
}  // namespace strata
