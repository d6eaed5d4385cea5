#include "common/chat/tool_call_parser.h"

#include <fstream>
#include <random>
#include <sstream>
#include <tuple>

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

std::string ParseWhole(absl::string_view reply, ToolCallFormat format = ToolCallFormat::kHermes,
                       const nlohmann::ordered_json& tools = nlohmann::ordered_json()) {
  return Show(ParseToolCalls(format, reply, tools));
}

// The reply fed in pieces cut at `cuts` (byte offsets, ascending).
std::vector<ReplyPiece> ParseInPieces(absl::string_view reply, const std::vector<size_t>& cuts,
                                      ToolCallFormat format = ToolCallFormat::kHermes) {
  std::unique_ptr<ToolCallParser> parser = NewToolCallParser(format);
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

// Every way of cutting a reply in two and three pieces gives what the whole reply gives.
void ExpectChunksSplitAnywhere(ToolCallFormat format, const std::vector<std::string>& replies) {
  for (const std::string& reply : replies) {
    const std::string whole = ParseWhole(reply, format);
    for (size_t a = 0; a <= reply.size(); ++a) {
      ASSERT_EQ(Show(ParseInPieces(reply, {a}, format)), whole) << reply << " cut at " << a;
    }
    std::mt19937 random(7);
    for (int trial = 0; trial < 300; ++trial) {
      size_t a = random() % (reply.size() + 1), b = random() % (reply.size() + 1);
      if (a > b) std::swap(a, b);
      ASSERT_EQ(Show(ParseInPieces(reply, {a, b}, format)), whole)
          << reply << " cut at " << a << ", " << b;
    }
    // One byte at a time.
    std::vector<size_t> every;
    for (size_t i = 1; i < reply.size(); ++i) every.push_back(i);
    EXPECT_EQ(Show(ParseInPieces(reply, every, format)), whole) << reply;
  }
}

TEST(ToolCallParserTest, ChunksSplitAnywhere) {
  ExpectChunksSplitAnywhere(
      ToolCallFormat::kHermes,
      {std::string(kTwoCalls),
       "x <tool_call>{\"name\": \"f\", \"arguments\": {\"s\": \"</tool\"}}</tool_call> y <tool_ca",
       "é<tool_call>{\"name\": \"g\"}</tool_call>é<tool_call>bad</tool_call>  ",
       "<tool_call>\n{\"name\": \"h\", \"arguments\": {}}\n"});
}

// DeepSeek-V3 / R1: a section of json code blocks, a newline between them.
constexpr absl::string_view kDeepSeekV3Calls =
    "I will check both.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>"
    "get_weather\n```json\n{\"city\": \"Zürich\", \"days\": 2}\n```<｜tool▁call▁end｜>\n"
    "<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time\n```json\n{\"zone\":\"Asia/Tokyo\"}\n"
    "```<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
// DeepSeek-V3.1: NAME<｜tool▁sep｜>ARGUMENTS, nothing between the blocks.
constexpr absl::string_view kDeepSeekV31Calls =
    "I will check both.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>"
    "{\"city\": \"Zürich\", \"days\": 2}<｜tool▁call▁end｜><｜tool▁call▁begin｜>get_time"
    "<｜tool▁sep｜>{\"zone\":\"Asia/Tokyo\"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
constexpr absl::string_view kBothCalls =
    "I will check both.[get_weather|{\"city\": \"Zürich\", \"days\": 2}]"
    "[get_time|{\"zone\": \"Asia/Tokyo\"}]";

TEST(DeepSeekToolCallsTest, WholeReplies) {
  for (ToolCallFormat format : {ToolCallFormat::kDeepSeekV3, ToolCallFormat::kDeepSeekV31}) {
    // Either parser reads either kind of block.
    EXPECT_EQ(ParseWhole(kDeepSeekV3Calls, format), kBothCalls);
    EXPECT_EQ(ParseWhole(kDeepSeekV31Calls, format), kBothCalls);
    // Text after the section stays; no text before it leaves no piece.
    EXPECT_EQ(ParseWhole("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{}"
                         "<｜tool▁call▁end｜><｜tool▁calls▁end｜>\n\nDone.",
                         format),
              "[f|{}]Done.");
    // Pretty-printed arguments, written back as json.dumps does.
    EXPECT_EQ(ParseWhole("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n"
                         "```json\n{\n  \"a\": [1, 2.5],\n  \"b\": null\n}\n```"
                         "<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
                         format),
              "[f|{\"a\": [1, 2.5], \"b\": null}]");
  }
  const std::vector<ReplyPiece> pieces =
      ParseToolCalls(ToolCallFormat::kDeepSeekV3, kDeepSeekV3Calls);
  ASSERT_EQ(pieces.size(), 3u);
  EXPECT_EQ(pieces[0].text, "I will check both.");
  EXPECT_EQ(pieces[1].call->name, "get_weather");
  EXPECT_EQ(pieces[1].call->id, "");
}

TEST(DeepSeekToolCallsTest, MalformedBlocksStayText) {
  const ToolCallFormat v3 = ToolCallFormat::kDeepSeekV3;
  // A section whose only block is not a call is text, markers and all.
  const std::string bad_json =
      "Hm <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{\"a\": }\n"
      "```<｜tool▁call▁end｜><｜tool▁calls▁end｜> after";
  EXPECT_EQ(ParseWhole(bad_json, v3), bad_json);
  const std::string no_name =
      "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜><｜tool▁sep｜>{}<｜tool▁call▁end｜>"
      "<｜tool▁calls▁end｜>";
  EXPECT_EQ(ParseWhole(no_name, v3), no_name);
  const std::string a_list =
      "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>[1]<｜tool▁call▁end｜>"
      "<｜tool▁calls▁end｜>";
  EXPECT_EQ(ParseWhole(a_list, v3), a_list);
  EXPECT_EQ(ParseWhole("<｜tool▁calls▁begin｜><｜tool▁calls▁end｜>", v3),
            "<｜tool▁calls▁begin｜><｜tool▁calls▁end｜>");
  // A bad block among good ones: only it stays text.
  EXPECT_EQ(
      ParseWhole("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{}"
                 "<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>oops<｜tool▁call▁end｜>"
                 "<｜tool▁call▁begin｜>g<｜tool▁sep｜>{}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
                 v3),
      "[f|{}]\n<｜tool▁call▁begin｜>oops<｜tool▁call▁end｜>[g|{}]");
  // Text inside the section ends it: the calls before stand, the text stays.
  EXPECT_EQ(ParseWhole("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{}"
                       "<｜tool▁call▁end｜> and more",
                       v3),
            "[f|{}]and more");
  EXPECT_EQ(ParseWhole("<｜tool▁calls▁begin｜> plain", v3), "<｜tool▁calls▁begin｜> plain");
}

TEST(DeepSeekToolCallsTest, UnclosedAtTheEnd) {
  // A whole call whose end marker never came is a call; the section's end may be missing.
  EXPECT_EQ(ParseWhole("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n"
                       "```json\n{\"x\": 1}\n```",
                       ToolCallFormat::kDeepSeekV3),
            "[f|{\"x\": 1}]");
  EXPECT_EQ(ParseWhole("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{}"
                       "<｜tool▁call▁end｜>",
                       ToolCallFormat::kDeepSeekV31),
            "[f|{}]");
  // One cut short (max_tokens) is text.
  const std::string cut =
      "Sure.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{\"x\": 1";
  EXPECT_EQ(ParseWhole(cut, ToolCallFormat::kDeepSeekV31), cut);
}

TEST(DeepSeekToolCallsTest, TextIsHeldBackOnlyWhileItMayStartASection) {
  std::unique_ptr<ToolCallParser> parser = NewToolCallParser(ToolCallFormat::kDeepSeekV31);
  EXPECT_EQ(Show(parser->Feed("Hello <｜tool")), "Hello");
  EXPECT_EQ(Show(parser->Feed("▁calls▁begin｜>")), "");
  EXPECT_EQ(Show(parser->Feed("\n<｜tool▁call▁begin｜>f<｜tool▁sep｜>{}")), "");
  EXPECT_EQ(Show(parser->Feed("<｜tool▁call▁end｜>")), "[f|{}]");
  EXPECT_EQ(Show(parser->Feed("<｜tool▁calls▁end｜>\n")), "");
  EXPECT_EQ(Show(parser->Feed("Bye")), "Bye");
  EXPECT_EQ(Show(parser->Finish()), "");
}

TEST(DeepSeekToolCallsTest, ChunksSplitAnywhere) {
  for (ToolCallFormat format : {ToolCallFormat::kDeepSeekV3, ToolCallFormat::kDeepSeekV31}) {
    ExpectChunksSplitAnywhere(
        format, {std::string(kDeepSeekV3Calls), std::string(kDeepSeekV31Calls),
                 "é <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>bad<｜tool▁call▁end｜> "
                 "<｜tool▁call▁begin｜>g<｜tool▁sep｜>{\"s\": \"<｜tool▁call▁end\"}"
                 "<｜tool▁call▁end｜><｜tool▁calls▁end｜>é <｜tool▁ca"});
  }
}

// GLM: one block per call, its arguments as key and value pairs.
const nlohmann::ordered_json& GlmTools() {
  static const nlohmann::ordered_json tools = nlohmann::ordered_json::parse(R"([
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
     "properties": {"city": {"type": "string"}, "days": {"type": "integer"},
                    "note": {"type": "string"}, "filters": {"type": "object"}}}}}])");
  return tools;
}

constexpr absl::string_view kGlmCalls =
    "Checking both.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Zürich"
    "</arg_value>\n<arg_key>days</arg_key>\n<arg_value>2</arg_value>\n</tool_call>\n"
    "<tool_call>get_time\n<arg_key>zone</arg_key>\n<arg_value>Asia/Tokyo</arg_value>\n"
    "</tool_call>";

TEST(GlmToolCallsTest, WholeReplies) {
  EXPECT_EQ(ParseWhole(kGlmCalls, ToolCallFormat::kGlm45, GlmTools()),
            "Checking both.[get_weather|{\"city\": \"Zürich\", \"days\": 2}]"
            "[get_time|{\"zone\": \"Asia/Tokyo\"}]");
  // Declared strings are kept as written (even when they read as JSON, with their spaces);
  // the other values are JSON when they read as JSON, Python's True/False/None as JSON's, and
  // the text otherwise. Without the tools nothing is known to be a string.
  const std::string call =
      "<tool_call>get_weather\n<arg_key>city</arg_key><arg_value>123</arg_value>"
      "<arg_key>note</arg_key><arg_value> two\nlines </arg_value>"
      "<arg_key>filters</arg_key><arg_value>{\"rain\": true}</arg_value>"
      "<arg_key>exact</arg_key><arg_value>True</arg_value>"
      "<arg_key>days</arg_key><arg_value> soon </arg_value></tool_call>";
  EXPECT_EQ(ParseWhole(call, ToolCallFormat::kGlm45, GlmTools()),
            "[get_weather|{\"city\": \"123\", \"note\": \" two\\nlines \", \"filters\": "
            "{\"rain\": true}, \"exact\": true, \"days\": \"soon\"}]");
  EXPECT_EQ(ParseWhole(call, ToolCallFormat::kGlm45),
            "[get_weather|{\"city\": 123, \"note\": \"two\\nlines\", \"filters\": "
            "{\"rain\": true}, \"exact\": true, \"days\": \"soon\"}]");
  // No arguments, with or without the name's newline.
  EXPECT_EQ(ParseWhole("<tool_call>now\n</tool_call>", ToolCallFormat::kGlm45), "[now|{}]");
  EXPECT_EQ(ParseWhole("<tool_call>now</tool_call> ok", ToolCallFormat::kGlm45), "[now|{}]ok");
  // Unicode keys and values.
  EXPECT_EQ(ParseWhole("<tool_call>météo\n<arg_key>ville</arg_key>\n<arg_value>東京 🌧"
                       "</arg_value>\n</tool_call>",
                       ToolCallFormat::kGlm45),
            "[météo|{\"ville\": \"東京 🌧\"}]");
}

TEST(GlmToolCallsTest, MalformedBlocksStayText) {
  for (const std::string bad :
       {"<tool_call>get_weather\n<arg_key>city</arg_key>stray<arg_value>x</arg_value>"
        "</tool_call>",
        "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>x</tool_call>",
        "<tool_call>get_weather\nwords<arg_key>a</arg_key><arg_value>1</arg_value></tool_call>",
        "<tool_call>two words\n</tool_call>", "<tool_call>bad</arg_key></tool_call>",
        "<tool_call>\n<arg_key>a</arg_key><arg_value>1</arg_value></tool_call>",
        "<tool_call>{\"name\": \"f\"}</tool_call>"}) {
    EXPECT_EQ(ParseWhole("a " + bad + " b", ToolCallFormat::kGlm45), "a " + bad + " b");
  }
  // A whole call left open at the end is a call; one cut short is text.
  EXPECT_EQ(ParseWhole("<tool_call>f\n<arg_key>a</arg_key>\n<arg_value>1</arg_value>\n",
                       ToolCallFormat::kGlm45),
            "[f|{\"a\": 1}]");
  EXPECT_EQ(ParseWhole("<tool_call>f\n<arg_key>a</arg_key>\n<arg_value>1", ToolCallFormat::kGlm45),
            "<tool_call>f\n<arg_key>a</arg_key>\n<arg_value>1");
}

TEST(GlmToolCallsTest, ChunksSplitAnywhere) {
  ExpectChunksSplitAnywhere(
      ToolCallFormat::kGlm45,
      {std::string(kGlmCalls),
       "é<tool_call>f\n<arg_key>s</arg_key><arg_value></tool</arg_value></tool_call>é "
       "<tool_call>bad</arg_key></tool_call> <tool_ca"});
}

// Kimi-K2: a section of calls, each with the model's id.
constexpr absl::string_view kKimiCalls =
    "Checking both.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
    "<|tool_call_argument_begin|>{\"city\": \"Zürich\", \"days\": 2}<|tool_call_end|>"
    "<|tool_call_begin|> functions.get_time:1 <|tool_call_argument_begin|> "
    "{\"zone\":\"Asia/Tokyo\"} <|tool_call_end|><|tool_calls_section_end|>";

TEST(KimiToolCallsTest, WholeReplies) {
  const std::vector<ReplyPiece> pieces = ParseToolCalls(ToolCallFormat::kKimiK2, kKimiCalls);
  EXPECT_EQ(Show(pieces),
            "Checking both.[get_weather|{\"city\": \"Zürich\", \"days\": 2}]"
            "[get_time|{\"zone\": \"Asia/Tokyo\"}]");
  ASSERT_EQ(pieces.size(), 3u);
  // The model's ids are kept: its template writes them back.
  EXPECT_EQ(pieces[1].call->id, "functions.get_weather:0");
  EXPECT_EQ(pieces[2].call->id, "functions.get_time:1");
  // A bare name:index is an id too.
  EXPECT_EQ(ParseWhole("<|tool_calls_section_begin|><|tool_call_begin|>f:3"
                       "<|tool_call_argument_begin|>{}<|tool_call_end|><|tool_calls_section_end|>",
                       ToolCallFormat::kKimiK2),
            "[f|{}]");
  // An id without its index is not a call.
  const std::string no_index =
      "<|tool_calls_section_begin|><|tool_call_begin|>functions.f<|tool_call_argument_begin|>{}"
      "<|tool_call_end|><|tool_calls_section_end|>";
  EXPECT_EQ(ParseWhole(no_index, ToolCallFormat::kKimiK2), no_index);
}

TEST(KimiToolCallsTest, ChunksSplitAnywhere) {
  ExpectChunksSplitAnywhere(ToolCallFormat::kKimiK2, {std::string(kKimiCalls)});
}

// The forced start of each format, and the reply that completes it, read back as the call.
TEST(ToolCallParserTest, ForcedPrefixOfEachFormat) {
  const std::tuple<ToolCallFormat, const char*, const char*, const char*> cases[] = {
      {ToolCallFormat::kDeepSeekV3,
       "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>",
       "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n",
       "{\"x\": 1}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>"},
      {ToolCallFormat::kDeepSeekV31, "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>",
       "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>",
       "{\"x\": 1}<｜tool▁call▁end｜><｜tool▁calls▁end｜>"},
      {ToolCallFormat::kGlm45, "<tool_call>", "<tool_call>f\n",
       "<arg_key>x</arg_key>\n<arg_value>1</arg_value>\n</tool_call>"},
      {ToolCallFormat::kKimiK2, "<|tool_calls_section_begin|><|tool_call_begin|>",
       "<|tool_calls_section_begin|><|tool_call_begin|>functions.f:",
       "0<|tool_call_argument_begin|>{\"x\": 1}<|tool_call_end|><|tool_calls_section_end|>"},
  };
  for (const auto& [format, any, named, rest] : cases) {
    EXPECT_EQ(ForcedCallPrefix(format, std::nullopt), any);
    EXPECT_EQ(ForcedCallPrefix(format, "f"), named);
    EXPECT_EQ(ParseWhole(std::string(named) + rest, format), "[f|{\"x\": 1}]") << named;
  }
}

TEST(ToolCallParserTest, ForcedCallGrammarOfEachFormat) {
  const nlohmann::ordered_json tools = nlohmann::ordered_json::parse(R"([
    {"type": "function", "function": {"name": "f", "parameters": {"type": "object",
     "properties": {"x": {"type": "integer"}}}}},
    {"type": "function", "function": {"name": "g"}}])");
  auto grammar = [&](ToolCallFormat format, std::optional<std::string> function, bool parallel) {
    return nlohmann::json::parse(*ForcedCallGrammar(format, tools, function, parallel))["format"];
  };
  // DeepSeek-V3, named: the arguments, the block's end, the section's end.
  auto named = grammar(ToolCallFormat::kDeepSeekV3, "f", false);
  ASSERT_EQ(named["elements"].size(), 3u);
  EXPECT_EQ(named["elements"][0]["json_schema"]["properties"]["x"]["type"], "integer");
  EXPECT_FALSE(named["elements"][0].contains("style"));
  EXPECT_EQ(named["elements"][1]["value"], "\n```<｜tool▁call▁end｜>");
  EXPECT_EQ(named["elements"][2]["value"], "<｜tool▁calls▁end｜>");
  // DeepSeek-V3.1, parallel: either function, later blocks, then the section's end.
  auto many = grammar(ToolCallFormat::kDeepSeekV31, std::nullopt, true);
  ASSERT_EQ(many["type"], "sequence");
  ASSERT_EQ(many["elements"].size(), 3u);
  EXPECT_EQ(many["elements"][0]["elements"][1]["elements"][0]["value"], "g<｜tool▁sep｜>");
  EXPECT_EQ(many["elements"][1]["content"]["elements"][0]["value"], "<｜tool▁call▁begin｜>");
  EXPECT_EQ(many["elements"][2]["value"], "<｜tool▁calls▁end｜>");
  // One call of either: the section ends after it.
  auto one = grammar(ToolCallFormat::kDeepSeekV31, std::nullopt, false);
  ASSERT_EQ(one["type"], "sequence");
  EXPECT_EQ(one["elements"][0]["type"], "or");
  EXPECT_EQ(one["elements"][1]["value"], "<｜tool▁calls▁end｜>");
  // GLM: the arguments as pairs (xgrammar's glm_xml, which takes the newline before the end).
  auto glm = grammar(ToolCallFormat::kGlm45, std::nullopt, false);
  ASSERT_EQ(glm["type"], "or");
  const auto& f = glm["elements"][0]["elements"];
  EXPECT_EQ(f[0]["value"], "f\n");
  EXPECT_EQ(f[1]["style"], "glm_xml");
  EXPECT_EQ(f[2]["value"], "</tool_call>");
  // Kimi: the index is the model's, then the arguments' marker.
  auto kimi = grammar(ToolCallFormat::kKimiK2, "f", false);
  EXPECT_EQ(kimi["elements"][0]["type"], "regex");
  EXPECT_EQ(kimi["elements"][1]["value"], "<|tool_call_argument_begin|>");
  EXPECT_EQ(kimi["elements"].back()["value"], "<|tool_calls_section_end|>");
}

TEST(ToolCallFormatTest, ChosenFromTheModelTemplates) {
  const std::pair<const char*, ToolCallFormat> templates[] = {
      {"deepseek_r1.jinja", ToolCallFormat::kDeepSeekV3},
      {"deepseek_v3_tools.jinja", ToolCallFormat::kDeepSeekV3},
      {"deepseek_v3.1.jinja", ToolCallFormat::kDeepSeekV31},
      {"deepseek_v3.1_tools.jinja", ToolCallFormat::kDeepSeekV31},
      {"glm_4.5.jinja", ToolCallFormat::kGlm45},
      {"glm_4.6.jinja", ToolCallFormat::kGlm45},
      {"kimi_k2_thinking.jinja", ToolCallFormat::kKimiK2},
      {"qwen3.jinja", ToolCallFormat::kHermes},
      {"mixtral.jinja", ToolCallFormat::kNone}};
  for (const auto& [file, format] : templates) {
    std::ifstream in(std::string(STRATA_TEST_DATA_DIR) + "/chat_templates/" + file);
    std::stringstream source;
    source << in.rdbuf();
    auto t = ChatTemplate::FromSource(source.str(), "", "");
    ASSERT_TRUE(t.ok()) << file << ": " << t.status();
    EXPECT_EQ(*ChooseToolCallFormat("auto", *t), format) << file;
  }
  // vLLM's names, which name the formats back.
  const ChatTemplate plain;
  for (const char* name : {"hermes", "deepseek_v3", "deepseek_v31", "glm45", "kimi_k2", "none"}) {
    auto format = ChooseToolCallFormat(name, plain);
    ASSERT_TRUE(format.ok()) << name;
    EXPECT_EQ(ToolCallFormatName(*format), name);
  }
  EXPECT_EQ(*ChooseToolCallFormat("deepseekv3", plain), ToolCallFormat::kDeepSeekV3);
  EXPECT_EQ(*ChooseToolCallFormat("deepseekv31", plain), ToolCallFormat::kDeepSeekV31);
  // DeepSeek-V3.2's DSML calls are another format.
  auto dsml = ChatTemplate::FromSource("<｜tool▁calls▁begin｜><｜DSML｜invoke>", "", "");
  EXPECT_EQ(*ChooseToolCallFormat("auto", *dsml), ToolCallFormat::kNone);
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
