#include "common/chat/jinja_render.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/chat/jinja_builtins.h"
#include "common/util/status_macros.h"

namespace strata::jinja {
namespace {

// Namespaces are the only mutable objects: a value holding this key refers to one by index.
constexpr char kNamespaceKey[] = "__namespace__";
// A macro is a value holding this key: the index of its definition.
constexpr char kMacroKey[] = "__macro__";

absl::Status ErrorAt(int line, absl::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat("chat template line ", line, ": ", message));
}

class Renderer {
 public:
  explicit Renderer(const Value& context) { scopes_.push_back({}), globals_ = &context; }

  absl::Status Run(const Body& body, std::string& out) {
    for (const auto& stmt : body) {
      RETURN_IF_ERROR(Exec(*stmt, out));
      // A {% break %} or {% continue %} skips the rest of every body up to its loop.
      if (control_ != Control::kNone) break;
    }
    return absl::OkStatus();
  }

 private:
  absl::Status Exec(const Stmt& s, std::string& out) {
    switch (s.kind) {
      case Stmt::Kind::kText:
        out += s.text;
        return absl::OkStatus();
      case Stmt::Kind::kOutput: {
        ASSIGN_OR_RETURN(Value v, Eval(*s.expr));
        out += ToText(v);
        return absl::OkStatus();
      }
      case Stmt::Kind::kIf:
        for (const auto& [condition, body] : s.branches) {
          bool taken = condition == nullptr;
          if (!taken) {
            ASSIGN_OR_RETURN(Value c, Eval(*condition));
            taken = Truthy(c);
          }
          if (taken) return Run(body, out);
        }
        return absl::OkStatus();
      case Stmt::Kind::kFor:
        return ExecFor(s, out);
      case Stmt::Kind::kSet: {
        ASSIGN_OR_RETURN(Value v, Eval(*s.expr));
        if (s.attribute.empty()) {
          scopes_.back()[s.targets[0]] = std::move(v);
          return absl::OkStatus();
        }
        const Value target = Lookup(s.targets[0]);
        if (!target.is_object() || !target.contains(kNamespaceKey)) {
          return ErrorAt(s.line, absl::StrCat("cannot set an attribute of '", s.targets[0],
                                              "': not a namespace"));
        }
        namespaces_[target[kNamespaceKey].get<size_t>()][s.attribute] = std::move(v);
        return absl::OkStatus();
      }
      case Stmt::Kind::kMacro: {
        // Defined where the statement runs, as Jinja does: a call before it finds no macro.
        Value handle = Value::object();
        handle[kMacroKey] = macros_.size();
        macros_.push_back(&s);
        scopes_.back()[s.targets[0]] = std::move(handle);
        return absl::OkStatus();
      }
      case Stmt::Kind::kBreak:
        control_ = Control::kBreak;
        return absl::OkStatus();
      case Stmt::Kind::kContinue:
        control_ = Control::kContinue;
        return absl::OkStatus();
    }
    return absl::OkStatus();
  }

  // A macro's body sees its parameters and the template's top-level names (not the variables
  // of the loops around the call), as in Jinja; what it sets stays inside it.
  absl::StatusOr<Value> CallMacro(const Stmt& macro, Args args, Kwargs kwargs, int line) {
    if (args.size() > macro.params.size()) {
      return ErrorAt(line, absl::StrCat("the macro '", macro.targets[0], "' takes ",
                                        macro.params.size(), " arguments, not ", args.size()));
    }
    std::map<std::string, Value> params;
    for (size_t i = 0; i < macro.params.size(); ++i) {
      const auto& [name, fallback] = macro.params[i];
      auto given = std::find_if(kwargs.begin(), kwargs.end(),
                                [&name = name](const auto& kw) { return kw.first == name; });
      if (i < args.size()) {
        params[name] = std::move(args[i]);
      } else if (given != kwargs.end()) {
        params[name] = std::move(given->second);
      } else if (fallback != nullptr) {
        ASSIGN_OR_RETURN(params[name], Eval(*fallback));
      } else {
        params[name] = Undefined();
      }
    }
    std::vector<std::map<std::string, Value>> caller_scopes = {scopes_.front(), std::move(params)};
    std::swap(scopes_, caller_scopes);
    std::string out;
    absl::Status status = Run(macro.body, out);
    std::swap(scopes_, caller_scopes);
    RETURN_IF_ERROR(status);
    return out;
  }

  absl::Status ExecFor(const Stmt& s, std::string& out) {
    ASSIGN_OR_RETURN(Value iterable, Eval(*s.expr));
    ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(iterable));
    if (items.empty()) return Run(s.else_body, out);
    const int64_t n = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < n; ++i) {
      scopes_.emplace_back();
      auto& scope = scopes_.back();
      if (s.targets.size() == 2) {
        if (!items[i].is_array() || items[i].size() != 2) {
          scopes_.pop_back();
          return ErrorAt(s.line, "cannot unpack a loop item into two names");
        }
        scope[s.targets[0]] = items[i][0];
        scope[s.targets[1]] = items[i][1];
      } else {
        scope[s.targets[0]] = items[i];
      }
      Value loop = Value::object();
      loop["index"] = i + 1;
      loop["index0"] = i;
      loop["revindex"] = n - i;
      loop["revindex0"] = n - i - 1;
      loop["first"] = i == 0;
      loop["last"] = i == n - 1;
      loop["length"] = n;
      loop["previtem"] = i > 0 ? items[i - 1] : Undefined();
      loop["nextitem"] = i + 1 < n ? items[i + 1] : Undefined();
      scope["loop"] = std::move(loop);
      absl::Status status = Run(s.body, out);
      scopes_.pop_back();
      RETURN_IF_ERROR(status);
      const Control control = control_;
      control_ = Control::kNone;
      if (control == Control::kBreak) break;
    }
    return absl::OkStatus();
  }

  Value Lookup(const std::string& name) const {
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
      auto found = it->find(name);
      if (found != it->end()) return found->second;
    }
    auto found = globals_->find(name);
    return found == globals_->end() ? Undefined() : *found;
  }

  absl::StatusOr<Value> Attribute(const Value& object, const std::string& name, int line) {
    if (object.is_object()) {
      if (object.contains(kNamespaceKey)) {
        const Value& ns = namespaces_[object[kNamespaceKey].get<size_t>()];
        auto it = ns.find(name);
        return it == ns.end() ? Undefined() : *it;
      }
      auto it = object.find(name);
      return it == object.end() ? Undefined() : *it;
    }
    if (IsUndefined(object))
      return ErrorAt(line, absl::StrCat("'", name, "' of an undefined value"));
    return Undefined();
  }

  absl::StatusOr<Value> Index(const Value& object, const Value& key, int line) {
    if (key.is_string()) return Attribute(object, key.get<std::string>(), line);
    if (!key.is_number_integer()) return ErrorAt(line, "an index must be a number or a string");
    int64_t i = key.get<int64_t>();
    if (object.is_array() || object.is_string()) {
      const int64_t n = object.is_array() ? static_cast<int64_t>(object.size())
                                          : static_cast<int64_t>(object.get<std::string>().size());
      if (i < 0) i += n;
      if (i < 0 || i >= n) return Undefined();
      if (object.is_array()) return object[i];
      return std::string(1, object.get<std::string>()[i]);
    }
    if (IsUndefined(object)) return ErrorAt(line, "indexing an undefined value");
    return Undefined();
  }

  absl::StatusOr<Value> Slice(const Value& object, const Expr& e) {
    std::optional<int64_t> bound[3];
    for (int k = 0; k < 3; ++k) {
      if (e.items[k + 1] == nullptr) continue;
      ASSIGN_OR_RETURN(Value v, Eval(*e.items[k + 1]));
      if (v.is_null()) continue;
      if (!v.is_number_integer()) return ErrorAt(e.line, "slice bounds must be integers");
      bound[k] = v.get<int64_t>();
    }
    ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(object));
    const int64_t n = static_cast<int64_t>(items.size());
    const int64_t step = bound[2].value_or(1);
    if (step == 0) return ErrorAt(e.line, "slice step cannot be zero");
    auto clamp = [&](std::optional<int64_t> b, int64_t fallback) {
      if (!b) return fallback;
      int64_t v = *b < 0 ? *b + n : *b;
      return step > 0 ? std::clamp<int64_t>(v, 0, n) : std::clamp<int64_t>(v, -1, n - 1);
    };
    const int64_t start = clamp(bound[0], step > 0 ? 0 : n - 1);
    const int64_t stop = clamp(bound[1], step > 0 ? n : -1);
    std::vector<Value> out;
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) out.push_back(items[i]);
    if (object.is_string()) {
      std::string s;
      for (const Value& c : out) s += c.get<std::string>();
      return s;
    }
    return Value(out);
  }

  // The arguments of a call, filter or test: e.items after the first, and the keywords.
  absl::Status EvalArgs(const Expr& e, Args& args, Kwargs& kwargs) {
    for (size_t i = 1; i < e.items.size(); ++i) {
      ASSIGN_OR_RETURN(Value v, Eval(*e.items[i]));
      args.push_back(std::move(v));
    }
    for (const auto& [key, expr] : e.kwargs) {
      ASSIGN_OR_RETURN(Value v, Eval(*expr));
      kwargs.emplace_back(key, std::move(v));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<Value> Call(const Expr& e) {
    Args args;
    Kwargs kwargs;
    RETURN_IF_ERROR(EvalArgs(e, args, kwargs));
    const Expr& callee = *e.items[0];
    if (callee.kind == Expr::Kind::kAttribute) {
      ASSIGN_OR_RETURN(Value self, Eval(*callee.items[0]));
      absl::StatusOr<Value> result = CallMethod(self, callee.name, args);
      if (absl::IsNotFound(result.status())) {
        return ErrorAt(e.line, absl::StrCat("the method '", callee.name, "' is not supported on ",
                                            ToText(self)));
      }
      if (!result.ok()) return ErrorAt(e.line, result.status().message());
      return result;
    }
    if (callee.kind != Expr::Kind::kName) return ErrorAt(e.line, "only names can be called");
    if (const Value macro = Lookup(callee.name); macro.is_object() && macro.contains(kMacroKey)) {
      return CallMacro(*macros_[macro[kMacroKey].get<size_t>()], std::move(args), std::move(kwargs),
                       e.line);
    }
    if (callee.name == "raise_exception") {
      return ErrorAt(e.line, args.empty() ? "raise_exception" : ToText(args[0]));
    }
    if (callee.name == "namespace") {
      Value ns = Value::object();
      for (auto& [key, value] : kwargs) ns[key] = std::move(value);
      namespaces_.push_back(std::move(ns));
      Value handle = Value::object();
      handle[kNamespaceKey] = namespaces_.size() - 1;
      return handle;
    }
    if (callee.name == "range") {
      int64_t start = 0, stop = 0, step = 1;
      if (args.size() == 1 && args[0].is_number_integer()) {
        stop = args[0].get<int64_t>();
      } else if (args.size() >= 2 && args[0].is_number_integer() && args[1].is_number_integer()) {
        start = args[0].get<int64_t>();
        stop = args[1].get<int64_t>();
        if (args.size() > 2 && args[2].is_number_integer()) step = args[2].get<int64_t>();
      }
      if (step == 0) return ErrorAt(e.line, "range() step cannot be zero");
      Value out = Value::array();
      for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) out.push_back(i);
      return out;
    }
    return ErrorAt(e.line, absl::StrCat("the function '", callee.name,
                                        "' is not supported by Strata's chat templates"));
  }

  absl::StatusOr<Value> Binary(const Expr& e) {
    const std::string& op = e.name;
    ASSIGN_OR_RETURN(Value a, Eval(*e.items[0]));
    if (op == "and") return Truthy(a) ? Eval(*e.items[1]) : absl::StatusOr<Value>(a);
    if (op == "or") return Truthy(a) ? absl::StatusOr<Value>(a) : Eval(*e.items[1]);
    ASSIGN_OR_RETURN(Value b, Eval(*e.items[1]));
    if (op == "==") return Equal(a, b);
    if (op == "!=") return !Equal(a, b);
    if (op == "in" || op == "not in") {
      bool found = false;
      if (b.is_string() && a.is_string()) {
        found = b.get<std::string>().find(a.get<std::string>()) != std::string::npos;
      } else if (b.is_array()) {
        for (const Value& item : b) found = found || Equal(item, a);
      } else if (b.is_object() && a.is_string()) {
        found = b.contains(a.get<std::string>());
      } else if (!IsUndefined(b) && !b.is_null()) {
        return ErrorAt(e.line, absl::StrCat("'in' needs a string, list or dict on its right"));
      }
      return op == "in" ? found : !found;
    }
    if (op == "~") return ToText(a) + ToText(b);
    if (IsUndefined(a) || IsUndefined(b)) {
      return ErrorAt(e.line, absl::StrCat("'", op, "' on an undefined value"));
    }
    if (op == "+" && a.is_string() && b.is_string()) {
      return a.get<std::string>() + b.get<std::string>();
    }
    if (op == "+" && a.is_array() && b.is_array()) {
      Value out = a;
      for (const Value& item : b) out.push_back(item);
      return out;
    }
    if (op == "<" || op == ">" || op == "<=" || op == ">=") {
      int cmp;
      if (a.is_number() && b.is_number()) {
        const double x = a.get<double>(), y = b.get<double>();
        cmp = x < y ? -1 : x > y ? 1 : 0;
      } else if (a.is_string() && b.is_string()) {
        cmp = a.get<std::string>().compare(b.get<std::string>());
      } else {
        return ErrorAt(e.line, absl::StrCat("cannot compare ", ToText(a), " and ", ToText(b)));
      }
      if (op == "<") return cmp < 0;
      if (op == ">") return cmp > 0;
      if (op == "<=") return cmp <= 0;
      return cmp >= 0;
    }
    if (!a.is_number() || !b.is_number()) {
      return ErrorAt(e.line, absl::StrCat("'", op, "' on ", ToText(a), " and ", ToText(b)));
    }
    const bool ints = a.is_number_integer() && b.is_number_integer();
    if (ints && op != "/") {
      const int64_t x = a.get<int64_t>(), y = b.get<int64_t>();
      if (op == "+") return x + y;
      if (op == "-") return x - y;
      if (op == "*") return x * y;
      if (y == 0) return ErrorAt(e.line, "division by zero");
      const int64_t q = x / y - ((x % y != 0 && ((x < 0) != (y < 0))) ? 1 : 0);
      if (op == "//") return q;
      if (op == "%") return x - q * y;
    }
    const double x = a.get<double>(), y = b.get<double>();
    if (op == "+") return x + y;
    if (op == "-") return x - y;
    if (op == "*") return x * y;
    if (y == 0) return ErrorAt(e.line, "division by zero");
    if (op == "/") return x / y;
    if (op == "//") return std::floor(x / y);
    if (op == "%") return x - std::floor(x / y) * y;
    return ErrorAt(e.line, absl::StrCat("the operator '", op, "' is not supported"));
  }

  absl::StatusOr<Value> Eval(const Expr& e) {
    switch (e.kind) {
      case Expr::Kind::kLiteral:
        return e.value;
      case Expr::Kind::kName:
        return Lookup(e.name);
      case Expr::Kind::kList: {
        Value out = Value::array();
        for (const auto& item : e.items) {
          ASSIGN_OR_RETURN(Value v, Eval(*item));
          out.push_back(std::move(v));
        }
        return out;
      }
      case Expr::Kind::kDict: {
        Value out = Value::object();
        for (size_t i = 0; i + 1 < e.items.size(); i += 2) {
          ASSIGN_OR_RETURN(Value k, Eval(*e.items[i]));
          ASSIGN_OR_RETURN(Value v, Eval(*e.items[i + 1]));
          out[ToText(k)] = std::move(v);
        }
        return out;
      }
      case Expr::Kind::kAttribute: {
        ASSIGN_OR_RETURN(Value object, Eval(*e.items[0]));
        return Attribute(object, e.name, e.line);
      }
      case Expr::Kind::kIndex: {
        ASSIGN_OR_RETURN(Value object, Eval(*e.items[0]));
        ASSIGN_OR_RETURN(Value key, Eval(*e.items[1]));
        return Index(object, key, e.line);
      }
      case Expr::Kind::kSlice: {
        ASSIGN_OR_RETURN(Value object, Eval(*e.items[0]));
        return Slice(object, e);
      }
      case Expr::Kind::kCall:
        return Call(e);
      case Expr::Kind::kFilter:
      case Expr::Kind::kTest: {
        ASSIGN_OR_RETURN(Value subject, Eval(*e.items[0]));
        Args args;
        Kwargs kwargs;
        RETURN_IF_ERROR(EvalArgs(e, args, kwargs));
        if (e.kind == Expr::Kind::kTest) {
          absl::StatusOr<bool> passed = ApplyTest(e.name, subject, args);
          if (!passed.ok()) return ErrorAt(e.line, passed.status().message());
          return *passed != e.negated;
        }
        absl::StatusOr<Value> filtered = ApplyFilter(e.name, subject, args, kwargs);
        if (!filtered.ok()) return ErrorAt(e.line, filtered.status().message());
        return filtered;
      }
      case Expr::Kind::kUnary: {
        ASSIGN_OR_RETURN(Value v, Eval(*e.items[0]));
        if (e.name == "not") return !Truthy(v);
        if (!v.is_number()) return ErrorAt(e.line, absl::StrCat("'", e.name, "' on a non-number"));
        if (e.name == "+") return v;
        if (v.is_number_integer()) return -v.get<int64_t>();
        return -v.get<double>();
      }
      case Expr::Kind::kBinary:
        return Binary(e);
      case Expr::Kind::kConditional: {
        ASSIGN_OR_RETURN(Value c, Eval(*e.items[1]));
        if (Truthy(c)) return Eval(*e.items[0]);
        if (e.items[2] == nullptr) return Undefined();
        return Eval(*e.items[2]);
      }
    }
    return ErrorAt(e.line, "an unknown expression");
  }

  enum class Control { kNone, kBreak, kContinue };

  std::vector<std::map<std::string, Value>> scopes_;
  const Value* globals_;
  std::vector<Value> namespaces_;
  std::vector<const Stmt*> macros_;
  Control control_ = Control::kNone;  // a {% break %} or {% continue %} on its way to its loop
};

}  // namespace

absl::StatusOr<std::string> Render(const Body& body, const Value& context) {
  Renderer renderer(context);
  std::string out;
  RETURN_IF_ERROR(renderer.Run(body, out));
  return out;
}

}  // namespace strata::jinja
