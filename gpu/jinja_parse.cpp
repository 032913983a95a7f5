// The Jinja parser (gpu/jinja.hpp): the template cut into text and tags with jinja2's whitespace
// rules (trim_blocks, lstrip_blocks, '-' and '+'), expressions tokenised and parsed by precedence,
// statements into the node tree of jinja_syntax.hpp. Nesting is bounded.
#include <algorithm>
#include <cctype>
#include <string>
#include <vector>

#include "gpu/jinja_syntax.hpp"

namespace weft::gpu::jinja {

namespace {

// ---- template lexing: text and tags, with whitespace control

struct segment {
  enum kind_t { text, expr, stmt } kind = text;
  std::string body;
  int line = 1;
};

std::vector<segment> split_template(std::string_view src) {
  struct raw {
    segment seg;
    bool strip_before = false, strip_after = false, keep_lstrip = false, block = false;
  };
  std::vector<raw> parts;
  size_t pos = 0;
  int line = 1;
  auto count_lines = [&](size_t a, size_t b) {
    line += static_cast<int>(std::count(src.begin() + static_cast<ptrdiff_t>(a),
                                        src.begin() + static_cast<ptrdiff_t>(b), '\n'));
  };
  while (pos < src.size()) {
    size_t open = std::string_view::npos;
    for (size_t p = src.find('{', pos); p != std::string_view::npos; p = src.find('{', p + 1)) {
      if (p + 1 < src.size() && (src[p + 1] == '{' || src[p + 1] == '%' || src[p + 1] == '#')) {
        open = p;
        break;
      }
    }
    if (open == std::string_view::npos) {
      parts.push_back({segment{segment::text, std::string(src.substr(pos)), line}});
      break;
    }
    if (open > pos)
      parts.push_back({segment{segment::text, std::string(src.substr(pos, open - pos)), line}});
    count_lines(pos, open);
    const char k = src[open + 1];
    const std::string_view close = k == '{' ? "}}" : k == '%' ? "%}" : "#}";
    size_t inner = open + 2;
    raw r;
    r.seg.line = line;
    if (inner < src.size() && src[inner] == '-') {
      r.strip_before = true;
      ++inner;
    } else if (inner < src.size() && src[inner] == '+') {
      r.keep_lstrip = true;
      ++inner;
    }
    size_t end = src.find(close, inner);
    if (k == '{') {
      // '}}' inside a string literal or a dict literal would end the tag early: skip strings.
      char quote = 0;
      int depth = 0;
      for (end = inner; end + 1 < src.size(); ++end) {
        const char c = src[end];
        if (quote) {
          if (c == '\\')
            ++end;
          else if (c == quote)
            quote = 0;
        } else if (c == '\'' || c == '"') {
          quote = c;
        } else if (c == '{') {
          ++depth;
        } else if (c == '}' && depth > 0) {
          --depth;
        } else if (c == '}' && src[end + 1] == '}') {
          break;
        }
      }
      if (end + 1 >= src.size()) end = std::string_view::npos;
    }
    if (end == std::string_view::npos) fail("line " + std::to_string(line) + ": unclosed tag");
    size_t body_end = end;
    if (body_end > inner && src[body_end - 1] == '-') {
      r.strip_after = true;
      --body_end;
    }
    r.block = k != '{';
    r.seg.kind = k == '{' ? segment::expr : segment::stmt;
    r.seg.body = std::string(src.substr(inner, body_end - inner));
    if (k == '#')
      r.seg.kind = segment::text, r.seg.body.clear();  // a comment: whitespace rules only
    parts.push_back(r);
    count_lines(open, end + 2);
    pos = end + 2;
  }
  // Whitespace control, then trim_blocks / lstrip_blocks for block tags (and comments). A text
  // starts a line when it starts the template or a newline before it went to trim_blocks.
  std::vector<bool> line_start(parts.size(), false);
  if (!parts.empty()) line_start[0] = true;
  auto is_text = [&](size_t k) { return parts[k].seg.kind == segment::text && !parts[k].block; };
  for (size_t i = 0; i < parts.size(); ++i) {
    auto& p = parts[i];
    if (!p.block && p.seg.kind != segment::expr) continue;
    if (i > 0 && is_text(i - 1)) {
      std::string& prev = parts[i - 1].seg.body;
      if (p.strip_before) {
        while (!prev.empty() && std::isspace(static_cast<unsigned char>(prev.back())))
          prev.pop_back();
      } else if (p.block && !p.keep_lstrip) {
        size_t j = prev.size();
        while (j > 0 && (prev[j - 1] == ' ' || prev[j - 1] == '\t')) --j;
        if (j > 0 ? prev[j - 1] == '\n' : line_start[i - 1]) prev.resize(j);
      }
    }
    if (i + 1 < parts.size() && is_text(i + 1)) {
      std::string& next = parts[i + 1].seg.body;
      if (p.strip_after) {
        size_t j = 0;
        while (j < next.size() && std::isspace(static_cast<unsigned char>(next[j]))) ++j;
        next.erase(0, j);
      } else if (p.block) {
        if (next.starts_with("\n")) {
          next.erase(0, 1);
          line_start[i + 1] = true;
        } else if (next.starts_with("\r\n")) {
          next.erase(0, 2);
          line_start[i + 1] = true;
        }
      }
    }
  }
  std::vector<segment> out;
  for (auto& p : parts) {
    if (p.block && p.seg.kind == segment::text) continue;  // comments
    if (p.seg.kind == segment::text && p.seg.body.empty()) continue;
    out.push_back(std::move(p.seg));
  }
  return out;
}

// ---- expression tokens

struct token {
  enum kind_t { name, str, integer, real, op, end } kind = end;
  std::string text;
  int64_t i = 0;
  double d = 0;
};

std::vector<token> lex(const std::string& s, int line) {
  std::vector<token> out;
  size_t i = 0;
  auto where = [&] { return "line " + std::to_string(line) + ": "; };
  while (i < s.size()) {
    const char c = s[i];
    if (std::isspace(static_cast<unsigned char>(c))) {
      ++i;
      continue;
    }
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t j = i;
      while (j < s.size() && (std::isalnum(static_cast<unsigned char>(s[j])) || s[j] == '_')) ++j;
      out.push_back({token::name, s.substr(i, j - i)});
      i = j;
      continue;
    }
    if (std::isdigit(static_cast<unsigned char>(c))) {
      size_t j = i;
      bool real = false;
      while (j < s.size() && (std::isdigit(static_cast<unsigned char>(s[j])) || s[j] == '_' ||
                              (s[j] == '.' && j + 1 < s.size() &&
                               std::isdigit(static_cast<unsigned char>(s[j + 1]))) ||
                              s[j] == 'e' || s[j] == 'E')) {
        if (s[j] == '.' || s[j] == 'e' || s[j] == 'E') real = true;
        ++j;
      }
      std::string num;
      for (size_t k = i; k < j; ++k)
        if (s[k] != '_') num += s[k];
      token t{real ? token::real : token::integer, num};
      try {
        if (real)
          t.d = std::stod(num);
        else
          t.i = std::stoll(num);
      } catch (const std::exception&) {
        fail(where() + "bad number '" + num + "'");
      }
      out.push_back(t);
      i = j;
      continue;
    }
    if (c == '\'' || c == '"') {
      std::string v;
      size_t j = i + 1;
      for (; j < s.size() && s[j] != c; ++j) {
        if (s[j] == '\\' && j + 1 < s.size()) {
          const char e = s[++j];
          switch (e) {
            case 'n':
              v += '\n';
              break;
            case 't':
              v += '\t';
              break;
            case 'r':
              v += '\r';
              break;
            case '\\':
              v += '\\';
              break;
            case '\'':
              v += '\'';
              break;
            case '"':
              v += '"';
              break;
            case 'u':
            case 'x': {
              const size_t digits = e == 'u' ? 4 : 2;
              if (j + digits >= s.size()) fail(where() + "bad \\" + std::string(1, e) + " escape");
              const unsigned cp =
                  static_cast<unsigned>(std::stoul(s.substr(j + 1, digits), nullptr, 16));
              j += digits;
              if (cp < 0x80) {
                v += static_cast<char>(cp);
              } else if (cp < 0x800) {
                v += static_cast<char>(0xC0 | (cp >> 6));
                v += static_cast<char>(0x80 | (cp & 0x3F));
              } else {
                v += static_cast<char>(0xE0 | (cp >> 12));
                v += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
                v += static_cast<char>(0x80 | (cp & 0x3F));
              }
              break;
            }
            default:
              v += '\\';
              v += e;
          }
        } else {
          v += s[j];
        }
      }
      if (j >= s.size()) fail(where() + "unterminated string");
      out.push_back({token::str, v});
      i = j + 1;
      continue;
    }
    static const char* ops[] = {"//", "**", "==", "!=", "<=", ">=", "(", ")", "[",
                                "]",  "{",  "}",  ",",  ".",  ":",  "|", "~", "+",
                                "-",  "*",  "/",  "%",  "<",  ">",  "="};
    bool found = false;
    for (const char* o : ops) {
      const size_t n = std::char_traits<char>::length(o);
      if (s.compare(i, n, o) == 0) {
        out.push_back({token::op, o});
        i += n;
        found = true;
        break;
      }
    }
    if (!found) fail(where() + "unexpected character '" + std::string(1, c) + "'");
  }
  out.push_back({token::end, ""});
  return out;
}

class expr_parser {
  struct depth_guard {
    int& d;
    depth_guard(int& dd, const expr_parser& p) : d(dd) {
      if (++d > 100) p.err("expression nested deeper than 100 levels");
    }
    ~depth_guard() { --d; }
  };

 public:
  expr_parser(std::vector<token> toks, int line) : t_(std::move(toks)), line_(line) {}

  expr_ptr parse_expression() { return ternary(); }
  bool at_end() const { return t_[p_].kind == token::end; }
  const token& peek(size_t k = 0) const { return t_[std::min(p_ + k, t_.size() - 1)]; }
  bool is_op(const char* o, size_t k = 0) const {
    return peek(k).kind == token::op && peek(k).text == o;
  }
  bool is_name(const char* n, size_t k = 0) const {
    return peek(k).kind == token::name && peek(k).text == n;
  }
  void expect_op(const char* o) {
    if (!is_op(o)) err(std::string("expected '") + o + "'");
    ++p_;
  }
  std::string expect_name() {
    if (peek().kind != token::name) err("expected a name");
    return t_[p_++].text;
  }
  void expect_end() {
    if (!at_end()) err("unexpected '" + peek().text + "'");
  }
  [[noreturn]] void err(const std::string& what) const {
    fail("line " + std::to_string(line_) + ": " + what +
         (peek().kind == token::end ? " at the end of the tag" : " near '" + peek().text + "'"));
  }
  void advance() { ++p_; }

  // Without the conditional: `for x in y if cond` uses it for the iterable.
  expr_ptr or_expr() {
    auto l = and_expr();
    while (is_name("or")) {
      ++p_;
      l = bin("or", l, and_expr());
    }
    return l;
  }

 private:
  static expr_ptr bin(std::string op, expr_ptr l, expr_ptr r) {
    auto e = std::make_shared<expr>(expr::binary);
    e->id = std::move(op);
    e->a = std::move(l);
    e->b = std::move(r);
    return e;
  }
  expr_ptr ternary() {
    auto v = or_expr();
    if (is_name("if")) {
      ++p_;
      auto e = std::make_shared<expr>(expr::ternary);
      e->a = v;
      e->b = or_expr();
      if (is_name("else")) {
        ++p_;
        e->c = ternary();
      }
      return e;
    }
    return v;
  }
  expr_ptr and_expr() {
    auto l = not_expr();
    while (is_name("and")) {
      ++p_;
      l = bin("and", l, not_expr());
    }
    return l;
  }
  expr_ptr not_expr() {
    depth_guard dg(depth_, *this);
    if (is_name("not")) {
      ++p_;
      auto e = std::make_shared<expr>(expr::unary);
      e->id = "not";
      e->a = not_expr();
      return e;
    }
    return compare();
  }
  expr_ptr compare() {
    auto l = additive();
    while (true) {
      std::string op;
      if (peek().kind == token::op &&
          (peek().text == "==" || peek().text == "!=" || peek().text == "<" || peek().text == ">" ||
           peek().text == "<=" || peek().text == ">=")) {
        op = peek().text;
        ++p_;
      } else if (is_name("in")) {
        op = "in";
        ++p_;
      } else if (is_name("not") && is_name("in", 1)) {
        op = "not in";
        p_ += 2;
      } else {
        break;
      }
      l = bin(op, l, additive());
    }
    return l;
  }
  expr_ptr additive() {
    auto l = concat();
    while (is_op("+") || is_op("-")) {
      const std::string op = t_[p_++].text;
      l = bin(op, l, concat());
    }
    return l;
  }
  expr_ptr concat() {
    auto l = multiplicative();
    while (is_op("~")) {
      ++p_;
      l = bin("~", l, multiplicative());
    }
    return l;
  }
  expr_ptr multiplicative() {
    auto l = power();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const std::string op = t_[p_++].text;
      l = bin(op, l, power());
    }
    return l;
  }
  expr_ptr power() {
    auto l = unary();
    if (is_op("**")) {
      ++p_;
      l = bin("**", l, unary());
    }
    return l;
  }
  expr_ptr unary() {
    depth_guard dg(depth_, *this);
    if (is_op("-") || is_op("+")) {
      auto e = std::make_shared<expr>(expr::unary);
      e->id = t_[p_++].text;
      e->a = unary();
      return e;
    }
    return postfix(primary());
  }
  void call_args(expr& e) {
    expect_op("(");
    while (!is_op(")")) {
      if (peek().kind == token::name && is_op("=", 1)) {
        std::string k = t_[p_].text;
        p_ += 2;
        e.kwargs.emplace_back(std::move(k), ternary());
      } else {
        e.args.push_back(ternary());
      }
      if (!is_op(",")) break;
      ++p_;
    }
    expect_op(")");
  }
  expr_ptr postfix(expr_ptr v) {
    while (true) {
      if (is_op(".")) {
        ++p_;
        auto e = std::make_shared<expr>(expr::attr);
        e->a = v;
        e->id = expect_name();
        v = e;
      } else if (is_op("[")) {
        ++p_;
        expr_ptr parts[3];
        int n = 0;
        bool sliced = false;
        while (true) {
          if (!is_op(":") && !is_op("]")) parts[n] = ternary();
          if (is_op(":")) {
            sliced = true;
            if (++n > 2) err("a slice has at most two ':'");
            ++p_;
            continue;
          }
          break;
        }
        expect_op("]");
        auto e = std::make_shared<expr>(sliced ? expr::slice : expr::index);
        e->a = v;
        if (sliced) {
          e->args = {parts[0], parts[1], parts[2]};
        } else {
          if (!parts[0]) err("empty subscript");
          e->b = parts[0];
        }
        v = e;
      } else if (is_op("(")) {
        auto e = std::make_shared<expr>(expr::call);
        e->a = v;
        call_args(*e);
        v = e;
      } else if (is_op("|")) {
        ++p_;
        auto e = std::make_shared<expr>(expr::filter);
        e->a = v;
        e->id = expect_name();
        if (is_op("(")) call_args(*e);
        v = e;
      } else if (is_name("is")) {
        ++p_;
        auto e = std::make_shared<expr>(expr::test);
        e->a = v;
        if (is_name("not")) {
          e->negate = true;
          ++p_;
        }
        // Tests named like keywords.
        if (peek().kind == token::name) {
          e->id = t_[p_++].text;
        } else if (peek().kind == token::op && (peek().text == "==" || peek().text == "!=")) {
          e->id = t_[p_++].text == "==" ? "eq" : "ne";
        } else {
          err("expected a test name");
        }
        if (is_op("(")) {
          call_args(*e);
        } else if (peek().kind == token::str || peek().kind == token::integer ||
                   peek().kind == token::real ||
                   (peek().kind == token::name && !is_name("and") && !is_name("or") &&
                    !is_name("else") && !is_name("if") && !is_name("is") && !is_name("in") &&
                    !is_name("not"))) {
          e->args.push_back(primary());  // `x is divisibleby 3`, `x is equalto y`
        }
        v = e;
      } else {
        return v;
      }
    }
  }
  expr_ptr primary() {
    depth_guard dg(depth_, *this);
    const token& t = peek();
    auto lit = [&](value v) {
      auto e = std::make_shared<expr>(expr::literal);
      e->lit = std::move(v);
      ++p_;
      return e;
    };
    switch (t.kind) {
      case token::str: {
        // Adjacent literals concatenate ('a' 'b').
        std::string s = t.text;
        ++p_;
        while (peek().kind == token::str) s += t_[p_++].text;
        auto e = std::make_shared<expr>(expr::literal);
        e->lit = s;
        return e;
      }
      case token::integer:
        return lit(value(t.i));
      case token::real:
        return lit(value(t.d));
      case token::name: {
        if (t.text == "true" || t.text == "True") return lit(value(true));
        if (t.text == "false" || t.text == "False") return lit(value(false));
        if (t.text == "none" || t.text == "None") return lit(value(nullptr));
        auto e = std::make_shared<expr>(expr::name);
        e->id = t.text;
        ++p_;
        return e;
      }
      case token::op:
        if (t.text == "(") {
          ++p_;
          auto first = ternary();
          if (is_op(",")) {  // a tuple: a list here
            auto e = std::make_shared<expr>(expr::list);
            e->args.push_back(first);
            while (is_op(",")) {
              ++p_;
              if (is_op(")")) break;
              e->args.push_back(ternary());
            }
            expect_op(")");
            return e;
          }
          expect_op(")");
          return first;
        }
        if (t.text == "[") {
          ++p_;
          auto e = std::make_shared<expr>(expr::list);
          while (!is_op("]")) {
            e->args.push_back(ternary());
            if (!is_op(",")) break;
            ++p_;
          }
          expect_op("]");
          return e;
        }
        if (t.text == "{") {
          ++p_;
          auto e = std::make_shared<expr>(expr::dict);
          while (!is_op("}")) {
            e->args.push_back(ternary());
            expect_op(":");
            e->args.push_back(ternary());
            if (!is_op(",")) break;
            ++p_;
          }
          expect_op("}");
          return e;
        }
        break;
      default:
        break;
    }
    err("expected a value");
  }

  std::vector<token> t_;
  size_t p_ = 0;
  int line_;
  int depth_ = 0;
};

class stmt_parser {
 public:
  explicit stmt_parser(std::vector<segment> segs) : s_(std::move(segs)) {}

  node_ptr parse_all() {
    auto root = parse_block({});
    if (i_ < s_.size())
      fail("line " + std::to_string(s_[i_].line) + ": unexpected '" + keyword(s_[i_]) + "'");
    return root;
  }

 private:
  static std::string keyword(const segment& s) {
    size_t a = 0;
    while (a < s.body.size() && std::isspace(static_cast<unsigned char>(s.body[a]))) ++a;
    size_t b = a;
    while (b < s.body.size() &&
           (std::isalnum(static_cast<unsigned char>(s.body[b])) || s.body[b] == '_'))
      ++b;
    return s.body.substr(a, b - a);
  }
  // Parses nodes until a statement whose keyword is in `stops` (left unconsumed).
  node_ptr parse_block(const std::vector<std::string>& stops) {
    struct depth_guard {
      int& d;
      explicit depth_guard(int& dd) : d(dd) {
        if (++d > 100) fail("statements nested deeper than 100 levels");
      }
      ~depth_guard() { --d; }
    } dg(depth_);
    auto blk = std::make_shared<node>();
    blk->kind = node::block;
    while (i_ < s_.size()) {
      const segment& s = s_[i_];
      if (s.kind == segment::text) {
        auto n = std::make_shared<node>();
        n->kind = node::text_node;
        n->text = s.body;
        blk->children.push_back(n);
        ++i_;
      } else if (s.kind == segment::expr) {
        expr_parser p(lex(s.body, s.line), s.line);
        auto n = std::make_shared<node>();
        n->kind = node::output;
        n->e = p.parse_expression();
        p.expect_end();
        blk->children.push_back(n);
        ++i_;
      } else {
        const std::string kw = keyword(s);
        if (std::find(stops.begin(), stops.end(), kw) != stops.end()) return blk;
        blk->children.push_back(statement(kw));
      }
    }
    if (!stops.empty()) fail("missing '" + stops.back() + "' at the end of the template");
    return blk;
  }
  expr_parser tag_parser(const segment& s) {
    auto toks = lex(s.body, s.line);
    expr_parser p(std::move(toks), s.line);
    p.advance();  // the keyword
    return p;
  }
  node_ptr statement(const std::string& kw) {
    const segment& s = s_[i_];
    auto n = std::make_shared<node>();
    n->line = s.line;
    if (kw == "if") {
      n->kind = node::if_;
      auto p = tag_parser(s);
      auto cond = p.parse_expression();
      p.expect_end();
      ++i_;
      while (true) {
        auto body = parse_block({"elif", "else", "endif"});
        n->branches.emplace_back(cond, body);
        const std::string k = keyword(s_[i_]);
        if (k == "elif") {
          auto q = tag_parser(s_[i_]);
          cond = q.parse_expression();
          q.expect_end();
          ++i_;
          continue;
        }
        if (k == "else") {
          ++i_;
          n->else_body = parse_block({"endif"});
        }
        ++i_;  // endif
        return n;
      }
    }
    if (kw == "for") {
      n->kind = node::for_;
      auto p = tag_parser(s);
      n->targets.push_back(p.expect_name());
      while (p.is_op(",")) {
        p.advance();
        n->targets.push_back(p.expect_name());
      }
      if (!p.is_name("in")) p.err("expected 'in'");
      p.advance();
      n->e = p.or_expr();
      if (p.is_name("if")) {
        p.advance();
        n->cond = p.or_expr();
      }
      if (p.is_name("recursive")) p.err("recursive loops are not supported");
      p.expect_end();
      ++i_;
      n->body = parse_block({"else", "endfor"});
      if (keyword(s_[i_]) == "else") {
        ++i_;
        n->else_body = parse_block({"endfor"});
      }
      ++i_;
      return n;
    }
    if (kw == "set") {
      n->kind = node::set;
      auto p = tag_parser(s);
      n->targets.push_back(p.expect_name());
      if (p.is_op(".")) {
        p.advance();
        n->targets.push_back(p.expect_name());
      }
      if (!p.is_op("=")) p.err("only `set name = value` is supported (no set blocks)");
      p.advance();
      n->e = p.parse_expression();
      p.expect_end();
      ++i_;
      return n;
    }
    if (kw == "macro") {
      n->kind = node::macro;
      auto p = tag_parser(s);
      n->targets.push_back(p.expect_name());
      p.expect_op("(");
      while (!p.is_op(")")) {
        std::string name = p.expect_name();
        expr_ptr def;
        if (p.is_op("=")) {
          p.advance();
          def = p.parse_expression();
        }
        n->params.emplace_back(std::move(name), def);
        if (!p.is_op(",")) break;
        p.advance();
      }
      p.expect_op(")");
      p.expect_end();
      ++i_;
      n->body = parse_block({"endmacro"});
      ++i_;
      return n;
    }
    if (kw == "generation") {  // Hugging Face's marker of assistant text: rendered as is
      ++i_;
      auto body = parse_block({"endgeneration"});
      ++i_;
      return body;
    }
    if (kw == "break" || kw == "continue") {
      n->kind = kw == "break" ? node::brk : node::cont;
      ++i_;
      return n;
    }
    fail("line " + std::to_string(s.line) + ": unsupported statement '" + kw + "'");
  }

  std::vector<segment> s_;
  size_t i_ = 0;
  int depth_ = 0;
};

}  // namespace

node_ptr parse_template(std::string_view source) {
  stmt_parser p(split_template(source));
  return p.parse_all();
}

}  // namespace weft::gpu::jinja
