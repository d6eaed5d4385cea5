// What a request asks its output to be: free text, any JSON object, JSON that a schema
// validates, a match of a regular expression, one of a list of strings, or a structural tag
// (xgrammar's composition of literals, schemas and repetitions: tool-call blocks). Every front end
// reads its own fields into this; GrammarCompiler makes it a grammar.
#ifndef STRATA_COMMON_GRAMMAR_RESPONSE_FORMAT_H_
#define STRATA_COMMON_GRAMMAR_RESPONSE_FORMAT_H_

#include <string>
#include <utility>
#include <vector>

namespace strata {

struct ResponseFormat {
  enum class Type { kText, kJsonObject, kJsonSchema, kRegex, kChoice, kStructuralTag };
  Type type = Type::kText;
  std::string json_schema;           // kJsonSchema: the schema, as JSON text
  std::string regex;                 // kRegex: the whole output matches it
  std::vector<std::string> choices;  // kChoice: the output is exactly one of these
  // kStructuralTag: {"type": "structural_tag", "format": {...}} as JSON text (xgrammar's
  // docs/structural_tag).
  std::string structural_tag;

  bool constrained() const { return type != Type::kText; }

  static ResponseFormat JsonObject() { return Of(Type::kJsonObject); }
  static ResponseFormat JsonSchema(std::string schema) {
    ResponseFormat f = Of(Type::kJsonSchema);
    f.json_schema = std::move(schema);
    return f;
  }
  static ResponseFormat Regex(std::string regex) {
    ResponseFormat f = Of(Type::kRegex);
    f.regex = std::move(regex);
    return f;
  }
  static ResponseFormat StructuralTag(std::string tag) {
    ResponseFormat f = Of(Type::kStructuralTag);
    f.structural_tag = std::move(tag);
    return f;
  }
  static ResponseFormat Choice(std::vector<std::string> choices) {
    ResponseFormat f = Of(Type::kChoice);
    f.choices = std::move(choices);
    return f;
  }

 private:
  static ResponseFormat Of(Type type) {
    ResponseFormat f;
    f.type = type;
    return f;
  }
};

}  // namespace strata

#endif  // STRATA_COMMON_GRAMMAR_RESPONSE_FORMAT_H_
