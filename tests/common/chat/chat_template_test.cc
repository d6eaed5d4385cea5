#include "common/chat/chat_template.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "common/chat/jinja_parser.h"
#include "common/chat/jinja_render.h"
#include "gtest/gtest.h"

namespace strata {
namespace {

using jinja::Value;

std::string ReadTemplate(const std::string& name) {
  std::ifstream in(std::string(STRATA_TEST_DATA_DIR) + "/chat_templates/" + name);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

ChatTemplate Load(const std::string& name) {
  auto t = ChatTemplate::FromSource(ReadTemplate(name), "<s>", "</s>");
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? *std::move(t) : ChatTemplate();
}

Value Conversation() {
  return Value::parse(R"([
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "<think>\nhmm\n</think>\n\nHello!"},
    {"role": "user", "content": "Name a color."}])");
}

Value Alternating() {
  return Value::parse(R"([
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello!"},
    {"role": "user", "content": "Bye"}])");
}

// The expected strings are what jinja2 renders with transformers' settings (trim_blocks,
// lstrip_blocks).
TEST(ChatTemplateTest, Qwen3DropsEarlierThinking) {
  auto out = Load("qwen3.jinja").Render(Conversation(), true);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(*out,
            "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nName a color."
            "<|im_end|>\n<|im_start|>assistant\n");
}

TEST(ChatTemplateTest, Qwen3KeepsThinkingAfterTheLastQuery) {
  auto out = Load("qwen3.jinja")
                 .Render(Value::parse(R"([
    {"role": "user", "content": "2+2?"},
    {"role": "assistant", "content": "<think>\nadd\n</think>\n\n4"}])"),
                         false);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(*out,
            "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n<think>\nadd\n</think>"
            "\n\n4<|im_end|>\n");
}

TEST(ChatTemplateTest, Qwen3EnableThinkingFalse) {
  auto out = Load("qwen3.jinja")
                 .Render(Value::parse(R"([{"role": "user", "content": "Hi"}])"), true,
                         Value::parse(R"({"enable_thinking": false})"));
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(*out, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
}

TEST(ChatTemplateTest, Qwen2AddsDefaultSystem) {
  auto out = Load("qwen2.jinja").Render(Alternating(), true);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(*out,
            "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi"
            "<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nBye"
            "<|im_end|>\n<|im_start|>assistant\n");
  out = Load("qwen2.jinja").Render(Conversation(), true);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(*out,
            "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\n<think>\nhmm\n</think>\n\nHello!<|im_end|>\n"
            "<|im_start|>user\nName a color.<|im_end|>\n<|im_start|>assistant\n");
}

TEST(ChatTemplateTest, Mixtral) {
  auto out = Load("mixtral.jinja").Render(Alternating(), true);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(*out, "<s>[INST] Hi [/INST]Hello!</s>[INST] Bye [/INST]");
}

TEST(ChatTemplateTest, RaiseExceptionIsAnError) {
  auto out = Load("mixtral.jinja").Render(Conversation(), true);
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.status().message().find("Conversation roles must alternate"), std::string::npos)
      << out.status();
}

TEST(ChatTemplateTest, PlainFormatWithoutTemplate) {
  auto out = ChatTemplate().Render(Alternating(), true);
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(*out, "user: Hi\nassistant: Hello!\nuser: Bye\nassistant:");
}

TEST(ChatTemplateTest, DemoModelHasNoTemplate) {
  auto t =
      ChatTemplate::FromModelDir(std::string(STRATA_TEST_DATA_DIR) + "/../../models/strata-demo");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_FALSE(t->has_template());
}

// A fresh directory under the test's temporary directory with `files` (name -> text).
std::string ModelDir(const std::string& name, const std::map<std::string, std::string>& files) {
  const std::filesystem::path dir =
      std::filesystem::path(::testing::TempDir()) / ("chat_template_test_" + name);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  for (const auto& [file, text] : files) std::ofstream(dir / file, std::ios::binary) << text;
  return dir.string();
}

// Kimi-K2's layout: chat_template.jinja beside a tokenizer_config.json without a template.
TEST(ChatTemplateTest, KimiStyleDirectoryReadsChatTemplateJinja) {
  std::ifstream config_file(std::string(STRATA_TEST_DATA_DIR) +
                            "/tokenizers/kimi-style/tokenizer_config.json");
  std::stringstream config;
  config << config_file.rdbuf();
  ASSERT_FALSE(config.str().empty());
  const std::string dir =
      ModelDir("kimi", {{"tokenizer_config.json", config.str()},
                        {"chat_template.jinja", ReadTemplate("kimi_k2_thinking.jinja")}});
  auto t = ChatTemplate::FromModelDir(dir);
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_TRUE(t->has_template());
  EXPECT_EQ(t->source(), ReadTemplate("kimi_k2_thinking.jinja"));
  const Value spec = Value::parse(ReadTemplate("conversations.json"));
  const Value& chat = spec["cases"]["chat"];
  auto out = t->Render(chat["messages"], chat["add_generation_prompt"].get<bool>(),
                       chat.value("variables", Value::object()));
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(*out, ReadTemplate("expected/kimi_k2_thinking.chat.txt"));
  std::filesystem::remove_all(dir);
}

TEST(ChatTemplateTest, ChatTemplateJinjaTakesPriorityAndKeepsTheConfigsTokens) {
  const std::string dir = ModelDir(
      "priority",
      {{"tokenizer_config.json",
        R"({"chat_template": "config", "bos_token": "[BOS]", "eos_token": {"content": "[EOS]"}})"},
       {"chat_template.jinja", "{{ bos_token }}|{{ messages[0].content }}|{{ eos_token }}"}});
  auto t = ChatTemplate::FromModelDir(dir);
  ASSERT_TRUE(t.ok()) << t.status();
  auto out = t->Render(Alternating(), false);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(*out, "[BOS]|Hi|[EOS]");

  // Without tokenizer_config.json, the template has no bos/eos; with a bad template the error
  // names chat_template.jinja.
  const std::string alone = ModelDir("alone", {{"chat_template.jinja", "<{{ bos_token }}>"}});
  auto u = ChatTemplate::FromModelDir(alone);
  ASSERT_TRUE(u.ok()) << u.status();
  EXPECT_EQ(u->Render(Alternating(), false).value_or("error"), "<>");
  const std::string bad = ModelDir("bad", {{"chat_template.jinja", "{% if %}"}});
  absl::Status status = ChatTemplate::FromModelDir(bad).status();
  EXPECT_FALSE(status.ok());
  EXPECT_NE(status.message().find("chat_template.jinja"), std::string::npos) << status;
  for (const std::string& d : {dir, alone, bad}) std::filesystem::remove_all(d);
}

// A conversation with tools: parallel calls answered by two tool messages.
Value ToolConversation() {
  return Value::parse(R"([
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Weather in Paris and Tokyo?"},
    {"role": "assistant", "content": "", "tool_calls": [
      {"id": "call_1", "type": "function",
       "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
      {"id": "call_2", "type": "function",
       "function": {"name": "get_weather", "arguments": {"city": "東京"}}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "18C"},
    {"role": "tool", "tool_call_id": "call_2", "content": "22C"}])");
}

Value WeatherTools() {
  Value variables = Value::object();
  variables["tools"] = Value::parse(R"([{"type": "function", "function": {
      "name": "get_weather", "description": "Weather now", "parameters": {"type": "object",
      "properties": {"city": {"type": "string"}}, "required": ["city"]}}}])");
  return variables;
}

constexpr char kQwen3ToolsPreamble[] =
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are "
    "provided with function signatures within <tools></tools> XML tags:\n<tools>\n";
constexpr char kQwen3ToolsCoda[] =
    "\n</tools>\n\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": "
    "<function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n";

TEST(ChatTemplateTest, Qwen3WithToolsCallsAndResponses) {
  auto out = Load("qwen3.jinja").Render(ToolConversation(), true, WeatherTools());
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(*out, std::string("<|im_start|>system\nYou are terse.\n\n") + kQwen3ToolsPreamble +
                      "{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", "
                      "\"description\": \"Weather now\", \"parameters\": {\"type\": \"object\", "
                      "\"properties\": {\"city\": {\"type\": \"string\"}}, \"required\": "
                      "[\"city\"]}}}" +
                      kQwen3ToolsCoda +
                      "<|im_start|>user\nWeather in Paris and Tokyo?<|im_end|>\n"
                      "<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", "
                      "\"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n"
                      "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"東京\"}}\n"
                      "</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n18C\n"
                      "</tool_response>\n<tool_response>\n22C\n</tool_response><|im_end|>\n"
                      "<|im_start|>assistant\n");
}

TEST(ChatTemplateTest, Qwen3ToolCallWithTextAndStringArguments) {
  Value variables = Value::object();
  variables["tools"] = Value::parse(
      R"([{"type": "function", "function": {"name": "now", "parameters": {"type": "object",
          "properties": {}}}}])");
  auto out = Load("qwen3.jinja")
                 .Render(Value::parse(R"([
    {"role": "user", "content": "Time?"},
    {"role": "assistant", "content": "Let me look.", "tool_calls": [{"id": "call_9",
     "type": "function", "function": {"name": "now", "arguments": "{\"tz\": \"UTC\"}"}}]},
    {"role": "tool", "tool_call_id": "call_9", "content": "12:00"},
    {"role": "assistant", "content": "It is noon."}])"),
                         false, variables);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(*out, std::string("<|im_start|>system\n") + kQwen3ToolsPreamble +
                      "{\"type\": \"function\", \"function\": {\"name\": \"now\", \"parameters\": "
                      "{\"type\": \"object\", \"properties\": {}}}}" +
                      kQwen3ToolsCoda +
                      "<|im_start|>user\nTime?<|im_end|>\n<|im_start|>assistant\nLet me look.\n"
                      "<tool_call>\n{\"name\": \"now\", \"arguments\": {\"tz\": \"UTC\"}}\n"
                      "</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n12:00\n"
                      "</tool_response><|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
                      "It is noon.<|im_end|>\n");
}

// The demo model has no template: the plain format, with the tools on a first line and the
// calls as Hermes blocks.
TEST(ChatTemplateTest, DemoModelPlainFormatWithTools) {
  auto t =
      ChatTemplate::FromModelDir(std::string(STRATA_TEST_DATA_DIR) + "/../../models/strata-demo");
  ASSERT_TRUE(t.ok()) << t.status();
  auto out = t->Render(ToolConversation(), true, WeatherTools());
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(*out,
            "tools: [{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", "
            "\"description\": \"Weather now\", \"parameters\": {\"type\": \"object\", "
            "\"properties\": {\"city\": {\"type\": \"string\"}}, \"required\": [\"city\"]}}}]\n"
            "system: You are terse.\nuser: Weather in Paris and Tokyo?\nassistant: <tool_call>\n"
            "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n"
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"東京\"}}\n"
            "</tool_call>\ntool: 18C\ntool: 22C\nassistant:");
  // Without tools nothing changes.
  auto plain = t->Render(Alternating(), true, Value::object());
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(*plain, "user: Hi\nassistant: Hello!\nuser: Bye\nassistant:");
  // Text before a call is on its own line.
  auto with_text = t->Render(Value::parse(R"([{"role": "assistant", "content": "Checking.",
      "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {}}}]}])"),
                             false);
  ASSERT_TRUE(with_text.ok());
  EXPECT_EQ(*with_text,
            "assistant: Checking.\n<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n"
            "</tool_call>\n");
}

TEST(JinjaTest, ExpressionsAndWhitespace) {
  const std::string source =
      "{% for m in messages %}\n  {{ m.role }}: {{ m.content|trim }}\n{% endfor %}"
      "{{ messages|length }} {{ [1, 'a', none, true] }} {{ {'k': 1.5}|tojson }} "
      "{{ 'abc'[::-1] }} {{ 7 // 2 }} {{ -7 % 3 }} {{ 'x' ~ 1 }}{# note #}\n"
      "{% if x is not defined %}undef{% endif %}";
  auto body = jinja::Parse(source);
  ASSERT_TRUE(body.ok()) << body.status();
  Value context = Value::object();
  context["messages"] = Value::parse(R"([{"role": "user", "content": " Hi "}])");
  auto out = jinja::Render(*body, context);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(*out, "  user: Hi\n1 [1, 'a', None, True] {\"k\": 1.5} cba 3 2 x1undef");
}

TEST(JinjaTest, UnsupportedConstructsAreClearErrors) {
  auto call = jinja::Parse("text\n{% call f(x) %}{{ x }}{% endcall %}");
  ASSERT_FALSE(call.ok());
  EXPECT_NE(call.status().message().find("line 2"), std::string::npos) << call.status();
  EXPECT_NE(call.status().message().find("'call' is not supported"), std::string::npos);
  EXPECT_FALSE(jinja::Parse("{% break %}").ok());  // outside a loop
  EXPECT_FALSE(jinja::Parse("{% for x in y %}{% macro m() %}{% break %}{% endmacro %}"
                            "{% endfor %}")
                   .ok());

  auto body = jinja::Parse("{{ x|wordcount }}");
  ASSERT_TRUE(body.ok());
  Value context = Value::object();
  context["x"] = "a b";
  auto out = jinja::Render(*body, context);
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.status().message().find("filter 'wordcount' is not supported"), std::string::npos)
      << out.status();

  EXPECT_FALSE(jinja::Parse("{% if x %}never closed").ok());
  EXPECT_FALSE(jinja::Parse("{{ 'open string }}").ok());
}

// `source` parsed and rendered against `context`; a parse error is returned as it is.
absl::StatusOr<std::string> RenderSource(const std::string& source,
                                         const Value& context = Value::object()) {
  absl::StatusOr<jinja::Body> body = jinja::Parse(source);
  if (!body.ok()) return body.status();
  return jinja::Render(*body, context);
}

// Each source against what jinja2 renders for it.
TEST(JinjaTest, StatementsRenderAsJinja2Does) {
  const std::pair<const char*, const char*> cases[] = {
      // Namespaces outlive loop scopes; other sets in a loop stay in it.
      {"{% set ns = namespace(n=0) %}{% set plain = 0 %}"
       "{% for i in range(3) %}{% set ns.n = ns.n + i %}{% set plain = i %}{% endfor %}"
       "{{ ns.n }} {{ plain }} {{ 'a,b,c'.split(',')[-1] }} {{ ' x '.strip() }}",
       "3 0 c x"},
      // Macros: parameters with defaults, by position or keyword; the body sees the template's
      // top-level names (as they are when it is called) but not the caller's loop variables,
      // and what it sets stays inside it.
      {"{% set top = 'T' %}{%- macro m(a, b='d') -%}[{{ a }}{{ b }}{{ top }}{{ i }}]"
       "{% set top = 'changed' %}{%- endmacro -%}"
       "{{ m(1) }}{{ m(1, b=2) }}{% for i in [7] %}{{ m(i) }}{% endfor %}{{ top }}"
       "{{ m('x').endswith(']') }}{% macro n() %}{{ m('n') }}{% endmacro %}{{ n() }}",
       "[1dT][12T][7dT]TTrue[ndT]"},
      // Loop controls leave the innermost loop.
      {"{% for i in range(10) %}{% if i == 1 %}{% continue %}{% endif %}"
       "{% for j in [0, 1] %}{% if j %}{% break %}{% endif %}{{ i }}{% endfor %}"
       "{% if i == 3 %}{% break %}{% endif %},{% endfor %}.",
       "0,2,3."},
  };
  for (const auto& [source, expected] : cases) {
    auto out = RenderSource(source);
    ASSERT_TRUE(out.ok()) << source << ": " << out.status();
    EXPECT_EQ(*out, expected) << source;
  }
  // A macro exists from its definition on, and takes no more arguments than it names.
  EXPECT_FALSE(RenderSource("{{ m() }}{% macro m() %}x{% endmacro %}").ok());
  EXPECT_FALSE(RenderSource("{% macro m(a) %}{% endmacro %}{{ m(1, 2) }}").ok());
}

TEST(JinjaTest, TojsonArguments) {
  Value context = Value::object();
  context["x"] = Value::parse(R"({"b": "é東🌧", "a": [1, 2]})");
  auto out = RenderSource(
      "{{ x|tojson(ensure_ascii=True) }} {{ x|tojson(separators=(',', ':')) }} "
      "{{ x|tojson(sort_keys=true) }} {{ [1]|tojson(indent=1) }}",
      context);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(*out,
            "{\"b\": \"\\u00e9\\u6771\\ud83c\\udf27\", \"a\": [1, 2]} "
            "{\"b\":\"é東🌧\",\"a\":[1,2]} {\"a\": [1, 2], \"b\": \"é東🌧\"} [\n 1\n]");
  EXPECT_FALSE(RenderSource("{{ x|tojson(bogus=1) }}", context).ok());
}

// The templates of tests/data/chat_templates/conversations.json, each rendered for each of its
// conversations, against what jinja2 renders (render_expected.py wrote expected/).
TEST(ChatTemplateTest, ModelTemplatesRenderAsJinja2Does) {
  const Value spec = Value::parse(ReadTemplate("conversations.json"));
  ASSERT_TRUE(spec.is_object());
  int compared = 0;
  for (const auto& [name, tokens] : spec["templates"].items()) {
    auto t = ChatTemplate::FromSource(ReadTemplate(name), tokens["bos_token"].get<std::string>(),
                                      tokens["eos_token"].get<std::string>());
    ASSERT_TRUE(t.ok()) << name << ": " << t.status();
    for (const auto& [case_name, c] : spec["cases"].items()) {
      Value variables = c.value("variables", Value::object());
      if (c.value("with_tools", false)) variables["tools"] = spec["tools"];
      auto out = t->Render(c["messages"], c["add_generation_prompt"].get<bool>(), variables);
      ASSERT_TRUE(out.ok()) << name << " " << case_name << ": " << out.status();
      const std::string expected =
          ReadTemplate("expected/" + name.substr(0, name.size() - std::string(".jinja").size()) +
                       "." + case_name + ".txt");
      ASSERT_FALSE(expected.empty()) << name << " " << case_name;
      EXPECT_EQ(*out, expected) << name << " " << case_name;
      ++compared;
    }
  }
  EXPECT_EQ(compared, 28);
}

// DeepSeek's own templates add the arguments to strings: they get them as JSON text.
TEST(ChatTemplateTest, StringArgumentsForTemplatesThatAddThem) {
  const ChatTemplate t = Load("deepseek_v3.1.jinja");
  const Value messages = Value::parse(R"([{"role": "user", "content": "Go"},
      {"role": "assistant", "content": "", "tool_calls": [{"type": "function",
       "function": {"name": "f", "arguments": {"a": "é", "b": [1, 2.5]}}}]}])");
  auto out = t.Render(messages, false);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(*out,
            "<s><｜User｜>Go<｜Assistant｜></think><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f"
            "<｜tool▁sep｜>{\"a\": \"é\", \"b\": [1, 2.5]}<｜tool▁call▁end｜><｜tool▁calls▁end｜>"
            "<｜end▁of▁sentence｜>");
  // Another error is still the template's error.
  auto bad = ChatTemplate::FromSource("{{ raise_exception('no') }}", "", "");
  ASSERT_TRUE(bad.ok());
  auto failed = bad->Render(messages, false);
  ASSERT_FALSE(failed.ok());
  EXPECT_NE(failed.status().message().find("no"), std::string::npos);
}

}  // namespace
}  // namespace strata
