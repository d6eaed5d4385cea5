// The syntax tree of the Jinja subset that chat templates are written in (see jinja_parser.h
// for what is supported).
#ifndef STRATA_COMMON_CHAT_JINJA_AST_H_
#define STRATA_COMMON_CHAT_JINJA_AST_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "nlohmann/json.hpp"

namespace strata::jinja {

using Value = nlohmann::ordered_json;

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    kLiteral,      // value
    kName,         // name
    kList,         // items
    kDict,         // items as key, value pairs
    kAttribute,    // items[0].name
    kIndex,        // items[0][items[1]]
    kSlice,        // items[0][items[1]:items[2]:items[3]] (null parts are absent)
    kCall,         // items[0](items[1..], kwargs)
    kFilter,       // items[0] | name(items[1..], kwargs)
    kTest,         // items[0] is [not] name(items[1..]); negated
    kUnary,        // op items[0]: "not", "-", "+"
    kBinary,       // items[0] op items[1]
    kConditional,  // items[0] if items[1] else items[2] (items[2] may be null)
  };
  Kind kind;
  Value value;
  std::string name;  // name, attribute, filter, test, operator
  bool negated = false;
  std::vector<ExprPtr> items;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  int line = 1;
};

struct Stmt;
using Body = std::vector<std::unique_ptr<Stmt>>;

struct Stmt {
  enum class Kind {
    kText,      // text
    kOutput,    // {{ expr }}
    kIf,        // branches: (condition, body); a null condition is the else
    kFor,       // {% for targets in expr %} body {% else %} else_body {% endfor %}
    kSet,       // {% set target[.attribute] = expr %}
    kMacro,     // {% macro targets[0](params) %} body {% endmacro %}
    kBreak,     // {% break %} (loop controls)
    kContinue,  // {% continue %}
  };
  Kind kind;
  std::string text;
  ExprPtr expr;
  std::vector<std::pair<ExprPtr, Body>> branches;
  std::vector<std::string> targets;  // for: one or two names; set: the name
  std::string attribute;             // set ns.attribute
  // A macro's parameters in order, each with its default (null when it has none).
  std::vector<std::pair<std::string, ExprPtr>> params;
  Body body;
  Body else_body;
  int line = 1;
};

}  // namespace strata::jinja

#endif  // STRATA_COMMON_CHAT_JINJA_AST_H_
