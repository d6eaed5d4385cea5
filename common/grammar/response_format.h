// What a request asks its output to be: free text, any JSON object, JSON that a schema
// validates, a match of a regular expression, or one of a list of strings. Every front end
// reads its own fields into this; GrammarCompiler makes it a grammar.
#ifndef STRATA_COMMON_GRAMMAR_RESPONSE_FORMAT_H_
#define STRATA_COMMON_GRAMMAR_RESPONSE_FORMAT_H_

#include <string>
#include <vector>

namespace strata {

struct ResponseFormat {
  enum class Type { kText, kJsonObject, kJsonSchema, kRegex, kChoice };
  Type type = Type::kText;
  std::string json_schema;           // kJsonSchema: the schema, as JSON text
  std::string regex;                 // kRegex: the whole output matches it
  std::vector<std::string> choices;  // kChoice: the output is exactly one of these

  bool constrained() const { return type != Type::kText; }
};

}  // namespace strata

#endif  // STRATA_COMMON_GRAMMAR_RESPONSE_FORMAT_H_
