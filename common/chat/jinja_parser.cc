#include "common/chat/jinja_parser.h"

#include <algorithm>
#include <cctype>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/util/status_macros.h"

namespace strata::jinja {
namespace {

struct Token {
  enum class Kind { kName, kString, kNumber, kOp, kEnd };
  Kind kind = Kind::kEnd;
  std::string text;
  Value value;
};

// A piece of the template: text, or the tokens of one {{ }} or {% %} tag.
struct Piece {
  enum class Kind { kText, kOutput, kStatement };
  Kind kind;
  std::string text;
  std::vector<Token> tokens;
  int line = 1;
};

absl::Status ErrorAt(int line, absl::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat("chat template line ", line, ": ", message));
}

absl::StatusOr<std::vector<Token>> Lex(absl::string_view s, int line) {
  std::vector<Token> tokens;
  size_t i = 0;
  while (i < s.size()) {
    const char c = s[i];
    if (std::isspace(static_cast<unsigned char>(c))) {
      ++i;
      continue;
    }
    Token t;
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t j = i;
      while (j < s.size() && (std::isalnum(static_cast<unsigned char>(s[j])) || s[j] == '_')) ++j;
      t.kind = Token::Kind::kName;
      t.text = std::string(s.substr(i, j - i));
      i = j;
    } else if (std::isdigit(static_cast<unsigned char>(c))) {
      size_t j = i;
      bool is_float = false;
      while (j < s.size() && (std::isdigit(static_cast<unsigned char>(s[j])) ||
                              (s[j] == '.' && !is_float && j + 1 < s.size() &&
                               std::isdigit(static_cast<unsigned char>(s[j + 1]))))) {
        if (s[j] == '.') is_float = true;
        ++j;
      }
      const std::string digits(s.substr(i, j - i));
      t.kind = Token::Kind::kNumber;
      if (is_float) {
        t.value = std::stod(digits);
      } else {
        t.value = std::stoll(digits);
      }
      i = j;
    } else if (c == '\'' || c == '"') {
      std::string out;
      size_t j = i + 1;
      for (; j < s.size() && s[j] != c; ++j) {
        if (s[j] == '\\' && j + 1 < s.size()) {
          const char e = s[++j];
          switch (e) {
            case 'n':
              out += '\n';
              break;
            case 't':
              out += '\t';
              break;
            case 'r':
              out += '\r';
              break;
            default:
              out += e;
          }
        } else {
          out += s[j];
        }
      }
      if (j >= s.size()) return ErrorAt(line, "a string is not closed");
      t.kind = Token::Kind::kString;
      t.value = out;
      i = j + 1;
    } else {
      static const char* kTwo[] = {"==", "!=", "<=", ">=", "//", "**"};
      t.kind = Token::Kind::kOp;
      for (const char* op : kTwo) {
        if (s.substr(i, 2) == op) t.text = op;
      }
      if (t.text.empty()) {
        if (absl::string_view("+-*/%~<>=()[]{}.,:|").find(c) == absl::string_view::npos) {
          return ErrorAt(line, absl::StrCat("unexpected character '", std::string(1, c), "'"));
        }
        t.text = std::string(1, c);
      }
      i += t.text.size();
    }
    tokens.push_back(std::move(t));
  }
  tokens.push_back(Token{});
  return tokens;
}

int LineOf(absl::string_view source, size_t pos) {
  int line = 1;
  for (size_t i = 0; i < pos && i < source.size(); ++i) line += source[i] == '\n';
  return line;
}

// Splits the template into pieces, applying `-` trims, trim_blocks and lstrip_blocks.
absl::StatusOr<std::vector<Piece>> Split(absl::string_view source) {
  std::vector<Piece> pieces;
  size_t pos = 0;
  bool trim_next = false;     // a `-` closed the last tag
  bool newline_next = false;  // a block tag closed last: drop one newline (trim_blocks)
  while (pos <= source.size()) {
    size_t open = source.find('{', pos);
    while (open != absl::string_view::npos && open + 1 < source.size() &&
           absl::string_view("{%#").find(source[open + 1]) == absl::string_view::npos) {
      open = source.find('{', open + 1);
    }
    if (open + 1 >= source.size()) open = absl::string_view::npos;
    std::string text(source.substr(pos, open == absl::string_view::npos ? open : open - pos));
    if (trim_next) {
      text.erase(0, text.find_first_not_of(" \t\r\n") == std::string::npos
                        ? text.size()
                        : text.find_first_not_of(" \t\r\n"));
    } else if (newline_next && !text.empty() && text[0] == '\n') {
      text.erase(0, 1);
    }
    if (open == absl::string_view::npos) {
      if (!text.empty()) pieces.push_back({Piece::Kind::kText, std::move(text), {}, 1});
      break;
    }
    const char kind = source[open + 1];
    const bool minus = open + 2 < source.size() && source[open + 2] == '-';
    const bool plus = open + 2 < source.size() && source[open + 2] == '+';
    if (minus) {
      const size_t keep = text.find_last_not_of(" \t\r\n");
      text.erase(keep == std::string::npos ? 0 : keep + 1);
    } else if (kind != '{' && !plus) {
      // lstrip_blocks: a block tag alone at the start of its line (in the source) takes the
      // indent before it.
      size_t k = open;
      while (k > 0 && (source[k - 1] == ' ' || source[k - 1] == '\t')) --k;
      if (k == 0 || source[k - 1] == '\n') {
        text.erase(text.size() - std::min(text.size(), open - k));
      }
    }
    const int line = LineOf(source, open);
    if (!text.empty()) pieces.push_back({Piece::Kind::kText, std::move(text), {}, line});
    const absl::string_view close = kind == '{' ? "}}" : kind == '%' ? "%}" : "#}";
    const size_t end = source.find(close, open + 2);
    if (end == absl::string_view::npos) return ErrorAt(line, "a tag is not closed");
    const size_t inner_start = open + 2 + (minus || plus ? 1 : 0);
    size_t inner_end = end;
    trim_next = end > inner_start && source[end - 1] == '-';
    if (trim_next) --inner_end;
    newline_next = kind != '{';
    if (kind != '#') {
      ASSIGN_OR_RETURN(std::vector<Token> tokens,
                       Lex(source.substr(inner_start, inner_end - inner_start), line));
      pieces.push_back({kind == '{' ? Piece::Kind::kOutput : Piece::Kind::kStatement, "",
                        std::move(tokens), line});
    }
    pos = end + 2;
  }
  return pieces;
}

// Parses expressions from one tag's tokens.
class ExprParser {
 public:
  ExprParser(const std::vector<Token>& tokens, int line) : t_(tokens), line_(line) {}

  bool AtEnd() const { return t_[i_].kind == Token::Kind::kEnd; }
  bool IsName(absl::string_view name) const {
    return t_[i_].kind == Token::Kind::kName && t_[i_].text == name;
  }
  bool IsOp(absl::string_view op) const {
    return t_[i_].kind == Token::Kind::kOp && t_[i_].text == op;
  }
  absl::StatusOr<std::string> TakeName() {
    if (t_[i_].kind != Token::Kind::kName) return Error("expected a name");
    return t_[i_++].text;
  }
  absl::Status Expect(absl::string_view op) {
    if (!IsOp(op)) return Error(absl::StrCat("expected '", op, "'"));
    ++i_;
    return absl::OkStatus();
  }
  absl::Status ExpectName(absl::string_view name) {
    if (!IsName(name)) return Error(absl::StrCat("expected '", name, "'"));
    ++i_;
    return absl::OkStatus();
  }
  absl::Status ExpectEnd() {
    return AtEnd() ? absl::OkStatus() : Error("unexpected tokens at the end of the tag");
  }
  absl::Status Error(absl::string_view what) const {
    const Token& t = t_[i_];
    const std::string near = t.kind == Token::Kind::kEnd ? "the end of the tag"
                             : t.text.empty()            ? t.value.dump()
                                                         : t.text;
    return ErrorAt(line_, absl::StrCat(what, " near ", near));
  }

  // With `allow_conditional` false, `a if b` is left to the caller (for-loop filters).
  absl::StatusOr<ExprPtr> Parse() {
    ASSIGN_OR_RETURN(ExprPtr e, ParseOr());
    while (IsName("if")) {
      ++i_;
      ASSIGN_OR_RETURN(ExprPtr condition, ParseOr());
      ExprPtr otherwise;
      if (IsName("else")) {
        ++i_;
        ASSIGN_OR_RETURN(otherwise, ParseOr());
      }
      ExprPtr c = Make(Expr::Kind::kConditional);
      c->items.push_back(std::move(e));
      c->items.push_back(std::move(condition));
      c->items.push_back(std::move(otherwise));
      e = std::move(c);
    }
    return e;
  }

 private:
  ExprPtr Make(Expr::Kind kind) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = line_;
    return e;
  }
  ExprPtr Binary(std::string op, ExprPtr a, ExprPtr b) {
    ExprPtr e = Make(Expr::Kind::kBinary);
    e->name = std::move(op);
    e->items.push_back(std::move(a));
    e->items.push_back(std::move(b));
    return e;
  }

  absl::StatusOr<ExprPtr> ParseOr() {
    ASSIGN_OR_RETURN(ExprPtr e, ParseAnd());
    while (IsName("or")) {
      ++i_;
      ASSIGN_OR_RETURN(ExprPtr r, ParseAnd());
      e = Binary("or", std::move(e), std::move(r));
    }
    return e;
  }
  absl::StatusOr<ExprPtr> ParseAnd() {
    ASSIGN_OR_RETURN(ExprPtr e, ParseNot());
    while (IsName("and")) {
      ++i_;
      ASSIGN_OR_RETURN(ExprPtr r, ParseNot());
      e = Binary("and", std::move(e), std::move(r));
    }
    return e;
  }
  absl::StatusOr<ExprPtr> ParseNot() {
    if (IsName("not")) {
      ++i_;
      ASSIGN_OR_RETURN(ExprPtr operand, ParseNot());
      ExprPtr e = Make(Expr::Kind::kUnary);
      e->name = "not";
      e->items.push_back(std::move(operand));
      return e;
    }
    return ParseCompare();
  }
  absl::StatusOr<ExprPtr> ParseCompare() {
    ASSIGN_OR_RETURN(ExprPtr e, ParseAdd());
    while (true) {
      static const char* kOps[] = {"==", "!=", "<", ">", "<=", ">="};
      std::string op;
      for (const char* o : kOps) {
        if (IsOp(o)) op = o;
      }
      if (!op.empty()) {
        ++i_;
      } else if (IsName("in")) {
        ++i_;
        op = "in";
      } else if (IsName("not") && t_[i_ + 1].kind == Token::Kind::kName &&
                 t_[i_ + 1].text == "in") {
        i_ += 2;
        op = "not in";
      } else if (IsName("is")) {
        ++i_;
        ExprPtr test = Make(Expr::Kind::kTest);
        if (IsName("not")) {
          ++i_;
          test->negated = true;
        }
        // `none`, `true` and `false` are test names here, not literals.
        ASSIGN_OR_RETURN(test->name, TakeName());
        test->items.push_back(std::move(e));
        if (IsOp("(")) {
          RETURN_IF_ERROR(ParseArgs(*test));
        } else if (t_[i_].kind == Token::Kind::kString || t_[i_].kind == Token::Kind::kNumber) {
          ASSIGN_OR_RETURN(ExprPtr arg, ParsePrimary());
          test->items.push_back(std::move(arg));
        }
        e = std::move(test);
        continue;
      } else {
        return e;
      }
      ASSIGN_OR_RETURN(ExprPtr r, ParseAdd());
      e = Binary(op, std::move(e), std::move(r));
    }
  }
  absl::StatusOr<ExprPtr> ParseAdd() {
    ASSIGN_OR_RETURN(ExprPtr e, ParseConcat());
    while (IsOp("+") || IsOp("-")) {
      const std::string op = t_[i_++].text;
      ASSIGN_OR_RETURN(ExprPtr r, ParseConcat());
      e = Binary(op, std::move(e), std::move(r));
    }
    return e;
  }
  absl::StatusOr<ExprPtr> ParseConcat() {
    ASSIGN_OR_RETURN(ExprPtr e, ParseMul());
    while (IsOp("~")) {
      ++i_;
      ASSIGN_OR_RETURN(ExprPtr r, ParseMul());
      e = Binary("~", std::move(e), std::move(r));
    }
    return e;
  }
  absl::StatusOr<ExprPtr> ParseMul() {
    ASSIGN_OR_RETURN(ExprPtr e, ParseUnary());
    while (IsOp("*") || IsOp("/") || IsOp("//") || IsOp("%")) {
      const std::string op = t_[i_++].text;
      ASSIGN_OR_RETURN(ExprPtr r, ParseUnary());
      e = Binary(op, std::move(e), std::move(r));
    }
    return e;
  }
  absl::StatusOr<ExprPtr> ParseUnary() {
    if (IsOp("-") || IsOp("+")) {
      const std::string op = t_[i_++].text;
      ASSIGN_OR_RETURN(ExprPtr operand, ParseUnary());
      ExprPtr e = Make(Expr::Kind::kUnary);
      e->name = op;
      e->items.push_back(std::move(operand));
      return e;
    }
    ASSIGN_OR_RETURN(ExprPtr e, ParsePrimary());
    return ParsePostfix(std::move(e));
  }

  absl::Status ParseArgs(Expr& call) {
    RETURN_IF_ERROR(Expect("("));
    while (!IsOp(")")) {
      if (t_[i_].kind == Token::Kind::kName && t_[i_ + 1].kind == Token::Kind::kOp &&
          t_[i_ + 1].text == "=") {
        std::string key = t_[i_].text;
        i_ += 2;
        ASSIGN_OR_RETURN(ExprPtr v, Parse());
        call.kwargs.emplace_back(std::move(key), std::move(v));
      } else {
        ASSIGN_OR_RETURN(ExprPtr v, Parse());
        call.items.push_back(std::move(v));
      }
      if (!IsOp(",")) break;
      ++i_;
    }
    return Expect(")");
  }

  absl::StatusOr<ExprPtr> ParsePostfix(ExprPtr e) {
    while (true) {
      if (IsOp(".")) {
        ++i_;
        ExprPtr a = Make(Expr::Kind::kAttribute);
        ASSIGN_OR_RETURN(a->name, TakeName());
        a->items.push_back(std::move(e));
        e = std::move(a);
      } else if (IsOp("[")) {
        ++i_;
        ExprPtr parts[3];
        int colons = 0;
        for (int k = 0; k < 3; ++k) {
          if (!IsOp(":") && !IsOp("]")) {
            ASSIGN_OR_RETURN(parts[k], Parse());
          }
          if (k < 2 && IsOp(":")) {
            ++i_;
            ++colons;
          } else {
            break;
          }
        }
        RETURN_IF_ERROR(Expect("]"));
        ExprPtr x = Make(colons == 0 ? Expr::Kind::kIndex : Expr::Kind::kSlice);
        x->items.push_back(std::move(e));
        if (colons == 0) {
          if (parts[0] == nullptr) return Error("an empty subscript");
          x->items.push_back(std::move(parts[0]));
        } else {
          for (auto& p : parts) x->items.push_back(std::move(p));
        }
        e = std::move(x);
      } else if (IsOp("(")) {
        ExprPtr call = Make(Expr::Kind::kCall);
        call->items.push_back(std::move(e));
        RETURN_IF_ERROR(ParseArgs(*call));
        e = std::move(call);
      } else if (IsOp("|")) {
        ++i_;
        ExprPtr f = Make(Expr::Kind::kFilter);
        ASSIGN_OR_RETURN(f->name, TakeName());
        f->items.push_back(std::move(e));
        if (IsOp("(")) RETURN_IF_ERROR(ParseArgs(*f));
        e = std::move(f);
      } else {
        return e;
      }
    }
  }

  absl::StatusOr<ExprPtr> ParsePrimary() {
    const Token& t = t_[i_];
    if (t.kind == Token::Kind::kString || t.kind == Token::Kind::kNumber) {
      ExprPtr e = Make(Expr::Kind::kLiteral);
      e->value = t.value;
      ++i_;
      // Adjacent strings concatenate, as in Python.
      while (t.kind == Token::Kind::kString && t_[i_].kind == Token::Kind::kString) {
        e->value = e->value.get<std::string>() + t_[i_++].value.get<std::string>();
      }
      return e;
    }
    if (t.kind == Token::Kind::kName) {
      ++i_;
      ExprPtr e = Make(Expr::Kind::kLiteral);
      if (t.text == "true" || t.text == "True") {
        e->value = true;
      } else if (t.text == "false" || t.text == "False") {
        e->value = false;
      } else if (t.text == "none" || t.text == "None") {
        e->value = nullptr;
      } else {
        e->kind = Expr::Kind::kName;
        e->name = t.text;
      }
      return e;
    }
    if (IsOp("(")) {
      ++i_;
      ASSIGN_OR_RETURN(ExprPtr first, Parse());
      if (IsOp(")")) {
        ++i_;
        return first;
      }
      ExprPtr tuple = Make(Expr::Kind::kList);
      tuple->items.push_back(std::move(first));
      while (IsOp(",")) {
        ++i_;
        if (IsOp(")")) break;
        ASSIGN_OR_RETURN(ExprPtr item, Parse());
        tuple->items.push_back(std::move(item));
      }
      RETURN_IF_ERROR(Expect(")"));
      return tuple;
    }
    if (IsOp("[")) {
      ++i_;
      ExprPtr list = Make(Expr::Kind::kList);
      while (!IsOp("]")) {
        ASSIGN_OR_RETURN(ExprPtr item, Parse());
        list->items.push_back(std::move(item));
        if (!IsOp(",")) break;
        ++i_;
      }
      RETURN_IF_ERROR(Expect("]"));
      return list;
    }
    if (IsOp("{")) {
      ++i_;
      ExprPtr dict = Make(Expr::Kind::kDict);
      while (!IsOp("}")) {
        ASSIGN_OR_RETURN(ExprPtr key, Parse());
        RETURN_IF_ERROR(Expect(":"));
        ASSIGN_OR_RETURN(ExprPtr value, Parse());
        dict->items.push_back(std::move(key));
        dict->items.push_back(std::move(value));
        if (!IsOp(",")) break;
        ++i_;
      }
      RETURN_IF_ERROR(Expect("}"));
      return dict;
    }
    return Error("expected an expression");
  }

  const std::vector<Token>& t_;
  size_t i_ = 0;
  int line_;
};

// Builds statements from the pieces, block by block.
class BlockParser {
 public:
  explicit BlockParser(std::vector<Piece> pieces) : p_(std::move(pieces)) {}

  // Parses until one of `ends` (a statement keyword) or the end; `*end` says which.
  absl::StatusOr<Body> ParseBody(std::initializer_list<absl::string_view> ends, std::string* end) {
    Body body;
    while (i_ < p_.size()) {
      Piece& piece = p_[i_];
      auto stmt = std::make_unique<Stmt>();
      stmt->line = piece.line;
      if (piece.kind == Piece::Kind::kText) {
        stmt->kind = Stmt::Kind::kText;
        stmt->text = std::move(piece.text);
        ++i_;
        body.push_back(std::move(stmt));
        continue;
      }
      ExprParser x(piece.tokens, piece.line);
      if (piece.kind == Piece::Kind::kOutput) {
        stmt->kind = Stmt::Kind::kOutput;
        ASSIGN_OR_RETURN(stmt->expr, x.Parse());
        RETURN_IF_ERROR(x.ExpectEnd());
        ++i_;
        body.push_back(std::move(stmt));
        continue;
      }
      ASSIGN_OR_RETURN(const std::string keyword, x.TakeName());
      for (absl::string_view e : ends) {
        if (keyword == e) {
          *end = keyword;
          return body;
        }
      }
      ++i_;
      if (keyword == "if") {
        RETURN_IF_ERROR(ParseIf(x, *stmt));
      } else if (keyword == "for") {
        RETURN_IF_ERROR(ParseFor(x, *stmt));
      } else if (keyword == "set") {
        RETURN_IF_ERROR(ParseSet(x, *stmt));
      } else if (keyword == "macro") {
        RETURN_IF_ERROR(ParseMacro(x, *stmt));
      } else if (keyword == "break" || keyword == "continue") {
        if (loop_depth_ == 0) {
          return ErrorAt(piece.line, absl::StrCat("{% ", keyword, " %} outside a loop"));
        }
        stmt->kind = keyword == "break" ? Stmt::Kind::kBreak : Stmt::Kind::kContinue;
        RETURN_IF_ERROR(x.ExpectEnd());
      } else {
        return ErrorAt(piece.line, absl::StrCat("'", keyword,
                                                "' is not supported by Strata's chat templates "
                                                "(docs/http.md lists what is)"));
      }
      body.push_back(std::move(stmt));
    }
    if (ends.size() > 0) {
      return ErrorAt(p_.empty() ? 1 : p_.back().line,
                     absl::StrCat("missing {% ", *ends.begin(), " %}"));
    }
    return body;
  }

 private:
  // The tokens of the statement at i_, past its keyword.
  ExprParser Current(std::string* keyword) {
    ExprParser x(p_[i_].tokens, p_[i_].line);
    *keyword = *x.TakeName();
    return x;
  }

  absl::Status ParseIf(ExprParser& x, Stmt& stmt) {
    stmt.kind = Stmt::Kind::kIf;
    ASSIGN_OR_RETURN(ExprPtr condition, x.Parse());
    RETURN_IF_ERROR(x.ExpectEnd());
    while (true) {
      std::string end;
      ASSIGN_OR_RETURN(Body body, ParseBody({"endif", "elif", "else"}, &end));
      stmt.branches.emplace_back(std::move(condition), std::move(body));
      std::string keyword;
      ExprParser next = Current(&keyword);
      ++i_;
      if (end == "endif") return next.ExpectEnd();
      if (end == "elif") {
        ASSIGN_OR_RETURN(condition, next.Parse());
        RETURN_IF_ERROR(next.ExpectEnd());
        continue;
      }
      RETURN_IF_ERROR(next.ExpectEnd());
      ASSIGN_OR_RETURN(Body else_body, ParseBody({"endif"}, &end));
      stmt.branches.emplace_back(nullptr, std::move(else_body));
      Current(&keyword);
      ++i_;
      return absl::OkStatus();
    }
  }

  absl::Status ParseFor(ExprParser& x, Stmt& stmt) {
    stmt.kind = Stmt::Kind::kFor;
    ASSIGN_OR_RETURN(std::string name, x.TakeName());
    stmt.targets.push_back(name);
    if (x.IsOp(",")) {
      RETURN_IF_ERROR(x.Expect(","));
      ASSIGN_OR_RETURN(name, x.TakeName());
      stmt.targets.push_back(name);
    }
    RETURN_IF_ERROR(x.ExpectName("in"));
    ASSIGN_OR_RETURN(stmt.expr, x.Parse());
    if (x.IsName("recursive")) return x.Error("recursive loops are not supported");
    RETURN_IF_ERROR(x.ExpectEnd());
    std::string end;
    ++loop_depth_;
    absl::StatusOr<Body> body = ParseBody({"endfor", "else"}, &end);
    --loop_depth_;
    if (!body.ok()) return body.status();
    stmt.body = *std::move(body);
    std::string keyword;
    Current(&keyword);
    ++i_;
    if (end == "else") {
      ASSIGN_OR_RETURN(stmt.else_body, ParseBody({"endfor"}, &end));
      Current(&keyword);
      ++i_;
    }
    return absl::OkStatus();
  }

  absl::Status ParseSet(ExprParser& x, Stmt& stmt) {
    stmt.kind = Stmt::Kind::kSet;
    ASSIGN_OR_RETURN(std::string name, x.TakeName());
    stmt.targets.push_back(name);
    if (x.IsOp(".")) {
      RETURN_IF_ERROR(x.Expect("."));
      ASSIGN_OR_RETURN(stmt.attribute, x.TakeName());
    }
    if (!x.IsOp("=")) return x.Error("{% set %} blocks are not supported; expected '='");
    RETURN_IF_ERROR(x.Expect("="));
    ASSIGN_OR_RETURN(stmt.expr, x.Parse());
    return x.ExpectEnd();
  }

  // {% macro name(a, b=default) %}: the body runs when the macro is called (jinja_render.cc).
  absl::Status ParseMacro(ExprParser& x, Stmt& stmt) {
    stmt.kind = Stmt::Kind::kMacro;
    ASSIGN_OR_RETURN(std::string name, x.TakeName());
    stmt.targets.push_back(std::move(name));
    RETURN_IF_ERROR(x.Expect("("));
    while (!x.IsOp(")")) {
      ASSIGN_OR_RETURN(std::string param, x.TakeName());
      ExprPtr fallback;
      if (x.IsOp("=")) {
        RETURN_IF_ERROR(x.Expect("="));
        ASSIGN_OR_RETURN(fallback, x.Parse());
      }
      stmt.params.emplace_back(std::move(param), std::move(fallback));
      if (!x.IsOp(",")) break;
      RETURN_IF_ERROR(x.Expect(","));
    }
    RETURN_IF_ERROR(x.Expect(")"));
    RETURN_IF_ERROR(x.ExpectEnd());
    // A loop around the definition is not around the body, which runs where it is called.
    const int outer_loops = loop_depth_;
    loop_depth_ = 0;
    std::string end;
    absl::StatusOr<Body> body = ParseBody({"endmacro"}, &end);
    loop_depth_ = outer_loops;
    if (!body.ok()) return body.status();
    stmt.body = *std::move(body);
    std::string keyword;
    ExprParser close = Current(&keyword);
    ++i_;
    // {% endmacro name %} may repeat the name.
    if (!close.AtEnd()) {
      ASSIGN_OR_RETURN(std::string repeated, close.TakeName());
      if (repeated != stmt.targets[0]) return close.Error("{% endmacro %} names another macro");
    }
    return close.ExpectEnd();
  }

  std::vector<Piece> p_;
  size_t i_ = 0;
  int loop_depth_ = 0;  // for loops around the statement being parsed
};

}  // namespace

absl::StatusOr<Body> Parse(absl::string_view source) {
  ASSIGN_OR_RETURN(std::vector<Piece> pieces, Split(source));
  BlockParser parser(std::move(pieces));
  std::string end;
  return parser.ParseBody({}, &end);
}

}  // namespace strata::jinja
