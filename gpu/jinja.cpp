#include "gpu/jinja.hpp"

#include <algorithm>
#include <charconv>
#include <climits>
#include <cmath>
#include <cstdint>
#include <ctime>
#include <functional>
#include <map>
#include <stdexcept>
#include <vector>

#include "gpu/jinja_syntax.hpp"

// The Jinja renderer (gpu/jinja.hpp): values as Python/Jinja see them, the operators, filters,
// tests, methods and global functions chat templates use, over the tree parse_template builds.

namespace weft::gpu::jinja {

namespace {

using vt = value::value_t;

/// raise_exception() in the template.
struct raised : std::runtime_error {
  using std::runtime_error::runtime_error;
};

value undefined() {
  return value(vt::discarded);
}
bool is_undefined(const value& v) {
  return v.is_discarded();
}

constexpr size_t kMaxOutput = 16u << 20;
constexpr int64_t kMaxIterations = 1'000'000;
constexpr int kMaxDepth = 200;

// ---- values as Python/Jinja sees them

std::string py_float(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, d);
  std::string s(buf, r.ptr);
  if (s.find_first_of(".en") == std::string::npos) s += ".0";
  return s;
}

std::string py_repr(const value& v);

std::string py_str(const value& v) {
  switch (v.type()) {
    case vt::discarded:
      return "";
    case vt::null:
      return "None";
    case vt::boolean:
      return v.get<bool>() ? "True" : "False";
    case vt::number_integer:
      return std::to_string(v.get<int64_t>());
    case vt::number_unsigned:
      return std::to_string(v.get<uint64_t>());
    case vt::number_float:
      return py_float(v.get<double>());
    case vt::string:
      return v.get<std::string>();
    default:
      return py_repr(v);
  }
}

std::string py_repr(const value& v) {
  if (v.is_string()) {
    const std::string& s = v.get_ref<const std::string&>();
    const char q =
        s.find('\'') != std::string::npos && s.find('"') == std::string::npos ? '"' : '\'';
    std::string out(1, q);
    for (char c : s) {
      if (c == q || c == '\\') {
        out += '\\';
        out += c;
      } else if (c == '\n') {
        out += "\\n";
      } else if (c == '\t') {
        out += "\\t";
      } else if (c == '\r') {
        out += "\\r";
      } else {
        out += c;
      }
    }
    return out + q;
  }
  if (v.is_array()) {
    std::string out = "[";
    for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + py_repr(v[i]);
    return out + "]";
  }
  if (v.is_object()) {
    std::string out = "{";
    bool first = true;
    for (const auto& [k, x] : v.items()) {
      out += (first ? "" : ", ") + py_repr(value(k)) + ": " + py_repr(x);
      first = false;
    }
    return out + "}";
  }
  return py_str(v);
}

bool truthy(const value& v) {
  switch (v.type()) {
    case vt::discarded:
    case vt::null:
      return false;
    case vt::boolean:
      return v.get<bool>();
    case vt::number_integer:
    case vt::number_unsigned:
      return v.get<int64_t>() != 0;
    case vt::number_float:
      return v.get<double>() != 0.0;
    case vt::string:  // json::empty() is false for every string
      return !v.get_ref<const std::string&>().empty();
    case vt::array:
    case vt::object:
      return !v.empty();
    default:
      return false;
  }
}

// Python's json.dumps(x, ensure_ascii=False, indent=indent) with its default separators: what
// Hugging Face's `tojson` filter writes.
void json_dump(const value& v, int indent, int level, std::string& out) {
  auto nl = [&](int lv) {
    if (indent < 0) return;
    out += '\n';
    out.append(static_cast<size_t>(lv * indent), ' ');
  };
  switch (v.type()) {
    case vt::discarded:
      fail("tojson: the value is undefined");
    case vt::string: {
      out += '"';
      for (unsigned char c : v.get_ref<const std::string&>()) {
        switch (c) {
          case '"':
            out += "\\\"";
            break;
          case '\\':
            out += "\\\\";
            break;
          case '\n':
            out += "\\n";
            break;
          case '\r':
            out += "\\r";
            break;
          case '\t':
            out += "\\t";
            break;
          case '\b':
            out += "\\b";
            break;
          case '\f':
            out += "\\f";
            break;
          default:
            if (c < 0x20) {
              char buf[8];
              std::snprintf(buf, sizeof buf, "\\u%04x", c);
              out += buf;
            } else {
              out += static_cast<char>(c);
            }
        }
      }
      out += '"';
      return;
    }
    case vt::null:
      out += "null";
      return;
    case vt::boolean:
      out += v.get<bool>() ? "true" : "false";
      return;
    case vt::number_float: {
      const double d = v.get<double>();
      out += std::isnan(d)   ? "NaN"
             : std::isinf(d) ? (d > 0 ? "Infinity" : "-Infinity")
                             : py_float(d);
      return;
    }
    case vt::array: {
      if (v.empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (size_t i = 0; i < v.size(); ++i) {
        if (i) out += indent < 0 ? ", " : ",";
        nl(level + 1);
        json_dump(v[i], indent, level + 1, out);
      }
      nl(level);
      out += ']';
      return;
    }
    case vt::object: {
      if (v.empty()) {
        out += "{}";
        return;
      }
      out += '{';
      bool first = true;
      for (const auto& [k, x] : v.items()) {
        if (!first) out += indent < 0 ? ", " : ",";
        first = false;
        nl(level + 1);
        json_dump(value(k), indent, level + 1, out);
        out += ": ";
        json_dump(x, indent, level + 1, out);
      }
      nl(level);
      out += '}';
      return;
    }
    default:
      out += v.dump();
  }
}

// ---- rendering

struct macro_def {
  const node* n;
};

class renderer {
 public:
  explicit renderer(const value& ctx) {
    scopes_.emplace_back();
    if (ctx.is_object()) {
      for (const auto& [k, v] : ctx.items()) scopes_.back()[k] = v;
    }
  }

  std::string out;

  enum class flow { normal, brk, cont };

  flow run(const node& n) {
    switch (n.kind) {
      case node::text_node:
        write(n.text);
        return flow::normal;
      case node::output:
        write(py_str(eval(*n.e)));
        return flow::normal;
      case node::block:
        for (const auto& c : n.children) {
          if (auto f = run(*c); f != flow::normal) return f;
        }
        return flow::normal;
      case node::if_:
        for (const auto& [cond, body] : n.branches) {
          if (truthy(eval(*cond))) return run(*body);
        }
        return n.else_body ? run(*n.else_body) : flow::normal;
      case node::for_:
        return run_for(n);
      case node::set: {
        value v = eval(*n.e);
        if (n.targets.size() == 1) {
          scopes_.back()[n.targets[0]] = std::move(v);
        } else {
          value* ns = find_var(n.targets[0]);
          if (ns == nullptr || !ns->is_object())
            fail("line " + std::to_string(n.line) + ": '" + n.targets[0] + "' is not a namespace");
          (*ns)[n.targets[1]] = std::move(v);
        }
        return flow::normal;
      }
      case node::macro:
        macros_[n.targets[0]] = macro_def{&n};
        return flow::normal;
      case node::brk:
        return flow::brk;
      case node::cont:
        return flow::cont;
    }
    return flow::normal;
  }

 private:
  void write(const std::string& s) {
    out += s;
    if (out.size() > kMaxOutput) fail("the template writes more than 16 MiB");
  }
  value* find_var(const std::string& name) {
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
      auto f = it->find(name);
      if (f != it->end()) return &f->second;
    }
    return nullptr;
  }
  void tick() {
    if (++iterations_ > kMaxIterations) fail("the template loops more than a million times");
  }
  struct scope_guard {
    renderer& r;
    explicit scope_guard(renderer& rr) : r(rr) {
      if (r.scopes_.size() > kMaxDepth) fail("the template nests deeper than 200 scopes");
      r.scopes_.emplace_back();
    }
    ~scope_guard() { r.scopes_.pop_back(); }
  };

  static value items_of(const value& v) {
    if (v.is_array()) return v;
    value out = value::array();
    if (v.is_object()) {
      for (const auto& [k, x] : v.items()) out.push_back(value(k));
    } else if (v.is_string()) {
      for (char c : v.get_ref<const std::string&>()) out.push_back(std::string(1, c));
    } else if (!is_undefined(v) && !v.is_null()) {
      fail("cannot iterate over " + py_repr(v));
    }
    return out;
  }

  flow run_for(const node& n) {
    value seq = eval(*n.e);
    value items = items_of(seq);
    // The `if` filter applies before the loop variables are counted.
    std::vector<value> kept;
    for (auto& it : items) {
      if (n.cond) {
        scope_guard g(*this);
        bind(n.targets, it);
        if (!truthy(eval(*n.cond))) continue;
      }
      kept.push_back(it);
    }
    if (kept.empty()) return n.else_body ? run(*n.else_body) : flow::normal;
    const auto len = static_cast<int64_t>(kept.size());
    for (int64_t i = 0; i < len; ++i) {
      tick();
      scope_guard g(*this);
      bind(n.targets, kept[static_cast<size_t>(i)]);
      value loop = value::object();
      loop["index"] = i + 1;
      loop["index0"] = i;
      loop["revindex"] = len - i;
      loop["revindex0"] = len - i - 1;
      loop["first"] = i == 0;
      loop["last"] = i == len - 1;
      loop["length"] = len;
      loop["previtem"] = i > 0 ? kept[static_cast<size_t>(i - 1)] : undefined();
      loop["nextitem"] = i + 1 < len ? kept[static_cast<size_t>(i + 1)] : undefined();
      scopes_.back()["loop"] = std::move(loop);
      const flow f = run(*n.body);
      if (f == flow::brk) break;
    }
    return flow::normal;
  }
  void bind(const std::vector<std::string>& targets, const value& item) {
    if (targets.size() == 1) {
      scopes_.back()[targets[0]] = item;
      return;
    }
    if (!item.is_array() || item.size() != targets.size())
      fail("cannot unpack " + py_repr(item) + " into " + std::to_string(targets.size()) + " names");
    for (size_t k = 0; k < targets.size(); ++k) scopes_.back()[targets[k]] = item[k];
  }

  static double num(const value& v, const char* op) {
    if (v.is_number()) return v.get<double>();
    if (v.is_boolean()) return v.get<bool>() ? 1 : 0;
    fail(std::string("'") + op + "' needs numbers, got " + py_repr(v));
  }
  static bool both_int(const value& a, const value& b) {
    return (a.is_number_integer() || a.is_boolean()) && (b.is_number_integer() || b.is_boolean());
  }
  static int64_t as_int(const value& v) {
    return v.is_boolean() ? (v.get<bool>() ? 1 : 0) : v.get<int64_t>();
  }

  static bool equal(const value& a, const value& b) {
    if (is_undefined(a) || is_undefined(b)) return is_undefined(a) && is_undefined(b);
    if (a.is_number() && b.is_number()) return a.get<double>() == b.get<double>();
    return a == b;
  }
  static bool less(const value& a, const value& b) {
    if (a.is_number() && b.is_number()) return a.get<double>() < b.get<double>();
    if (a.is_string() && b.is_string()) return a.get<std::string>() < b.get<std::string>();
    fail("cannot compare " + py_repr(a) + " and " + py_repr(b));
  }
  static bool contains(const value& hay, const value& needle) {
    if (hay.is_string()) {
      if (!needle.is_string()) fail("'in <string>' needs a string on the left");
      return hay.get_ref<const std::string&>().find(needle.get_ref<const std::string&>()) !=
             std::string::npos;
    }
    if (hay.is_array()) {
      return std::any_of(hay.begin(), hay.end(), [&](const value& x) { return equal(x, needle); });
    }
    if (hay.is_object()) return needle.is_string() && hay.contains(needle.get<std::string>());
    if (is_undefined(hay) || hay.is_null()) return false;
    fail("'in' needs a string, list or mapping, got " + py_repr(hay));
  }

  value binary(const std::string& op, const expr& e) {
    if (op == "and") {
      value l = eval(*e.a);
      return truthy(l) ? eval(*e.b) : l;
    }
    if (op == "or") {
      value l = eval(*e.a);
      return truthy(l) ? l : eval(*e.b);
    }
    const value l = eval(*e.a);
    const value r = eval(*e.b);
    if (op == "==") return equal(l, r);
    if (op == "!=") return !equal(l, r);
    if (op == "<") return less(l, r);
    if (op == ">") return less(r, l);
    if (op == "<=") return !less(r, l);
    if (op == ">=") return !less(l, r);
    if (op == "in") return contains(r, l);
    if (op == "not in") return !contains(r, l);
    if (op == "~") return py_str(l) + py_str(r);
    if (op == "+") {
      if (l.is_string() && r.is_string()) return l.get<std::string>() + r.get<std::string>();
      if (l.is_array() && r.is_array()) {
        value out = l;
        for (const auto& x : r) out.push_back(x);
        return out;
      }
      if (int64_t z = 0; both_int(l, r) && !__builtin_add_overflow(as_int(l), as_int(r), &z))
        return z;
      if ((l.is_number() || l.is_boolean()) && (r.is_number() || r.is_boolean()))
        return num(l, "+") + num(r, "+");
      fail("cannot add " + py_repr(l) + " and " + py_repr(r));
    }
    if (op == "*" && l.is_string() && r.is_number_integer()) {
      std::string out;
      for (int64_t k = 0; k < std::min<int64_t>(r.get<int64_t>(), 1 << 20); ++k)
        out += l.get<std::string>();
      return out;
    }
    if (both_int(l, r) && op != "/") {
      // Python integers do not overflow; here an overflowing result becomes a float.
      const int64_t x = as_int(l), y = as_int(r);
      int64_t z = 0;
      if (op == "-" && !__builtin_sub_overflow(x, y, &z)) return z;
      if (op == "*" && !__builtin_mul_overflow(x, y, &z)) return z;
      if (op == "**" && y >= 0) {
        const double p = std::pow(static_cast<double>(x), static_cast<double>(y));
        if (std::fabs(p) < 9.0e18) return static_cast<int64_t>(p);
        return p;
      }
      if ((op == "//" || op == "%") && y == 0) fail("division by zero");
      if (op == "//" && !(x == INT64_MIN && y == -1)) {
        int64_t q = x / y;
        if (x % y != 0 && ((x < 0) != (y < 0))) --q;
        return q;
      }
      if (op == "%") {
        if (y == -1) return int64_t{0};
        int64_t m = x % y;
        if (m != 0 && ((m < 0) != (y < 0))) m += y;
        return m;
      }
    }
    const double x = num(l, op.c_str()), y = num(r, op.c_str());
    if (op == "-") return x - y;
    if (op == "*") return x * y;
    if (op == "**") return std::pow(x, y);
    if (y == 0) fail("division by zero");
    if (op == "/") return x / y;
    if (op == "//") return std::floor(x / y);
    if (op == "%") return x - y * std::floor(x / y);
    fail("unknown operator " + op);
  }

  static int64_t norm_index(int64_t i, int64_t n) { return i < 0 ? i + n : i; }

  static value subscript(const value& v, const value& k) {
    if (v.is_object()) {
      if (!k.is_string()) return undefined();
      auto it = v.find(k.get<std::string>());
      return it == v.end() ? undefined() : *it;
    }
    if ((v.is_array() || v.is_string()) && k.is_number_integer()) {
      const int64_t n = v.is_array() ? static_cast<int64_t>(v.size())
                                     : static_cast<int64_t>(v.get_ref<const std::string&>().size());
      const int64_t i = norm_index(k.get<int64_t>(), n);
      if (i < 0 || i >= n) return undefined();
      if (v.is_array()) return v[static_cast<size_t>(i)];
      return std::string(1, v.get_ref<const std::string&>()[static_cast<size_t>(i)]);
    }
    return undefined();
  }

  value slice(const value& v, const value& a, const value& b, const value& c) {
    const int64_t step = c.is_number_integer() ? c.get<int64_t>() : 1;
    if (step == 0) fail("slice step cannot be zero");
    const bool str = v.is_string();
    if (!str && !v.is_array()) fail("cannot slice " + py_repr(v));
    const int64_t n = str ? static_cast<int64_t>(v.get_ref<const std::string&>().size())
                          : static_cast<int64_t>(v.size());
    auto clamp = [&](const value& x, int64_t dflt) {
      if (!x.is_number_integer()) return dflt;
      int64_t i = norm_index(x.get<int64_t>(), n);
      return step > 0 ? std::clamp<int64_t>(i, 0, n) : std::clamp<int64_t>(i, -1, n - 1);
    };
    const int64_t lo = clamp(a, step > 0 ? 0 : n - 1), hi = clamp(b, step > 0 ? n : -1);
    std::string s;
    value arr = value::array();
    for (int64_t i = lo; step > 0 ? i < hi : i > hi; i += step) {
      if (str)
        s += v.get_ref<const std::string&>()[static_cast<size_t>(i)];
      else
        arr.push_back(v[static_cast<size_t>(i)]);
    }
    return str ? value(s) : arr;
  }

  struct call_args {
    std::vector<value> pos;
    std::vector<std::pair<std::string, value>> kw;
    const value* get(size_t i, const char* name) const {
      if (i < pos.size()) return &pos[i];
      for (const auto& [k, v] : kw) {
        if (k == name) return &v;
      }
      return nullptr;
    }
  };
  call_args args_of(const expr& e) {
    call_args a;
    for (const auto& x : e.args) a.pos.push_back(eval(*x));
    for (const auto& [k, x] : e.kwargs) a.kw.emplace_back(k, eval(*x));
    return a;
  }

  static std::string str_arg(const call_args& a, size_t i, const char* name, const char* fn) {
    const value* v = a.get(i, name);
    if (v == nullptr || !v->is_string())
      fail(std::string(fn) + ": argument '" + name + "' must be a string");
    return v->get<std::string>();
  }

  static std::string strip_chars(const std::string& s, const std::string& chars, bool left,
                                 bool right) {
    size_t a = 0, b = s.size();
    auto in = [&](char c) {
      return chars.empty() ? std::isspace(static_cast<unsigned char>(c)) != 0
                           : chars.find(c) != std::string::npos;
    };
    if (left)
      while (a < b && in(s[a])) ++a;
    if (right)
      while (b > a && in(s[b - 1])) --b;
    return s.substr(a, b - a);
  }
  static std::string title(const std::string& s) {
    std::string out = s;
    bool start = true;
    for (char& c : out) {
      if (std::isalpha(static_cast<unsigned char>(c))) {
        c = static_cast<char>(start ? std::toupper(static_cast<unsigned char>(c))
                                    : std::tolower(static_cast<unsigned char>(c)));
        start = false;
      } else {
        start = true;
      }
    }
    return out;
  }
  static std::string lower(std::string s) {
    for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return s;
  }
  static std::string upper(std::string s) {
    for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    return s;
  }
  static std::string replace_all(std::string s, const std::string& a, const std::string& b,
                                 int64_t count = -1) {
    if (a.empty()) return s;
    size_t p = 0;
    while (count != 0 && (p = s.find(a, p)) != std::string::npos) {
      s.replace(p, a.size(), b);
      p += b.size();
      --count;
    }
    return s;
  }

  value method(const value& obj, const std::string& m, const call_args& a) {
    if (obj.is_string()) {
      const std::string& s = obj.get_ref<const std::string&>();
      auto opt_chars = [&] {
        const value* c = a.get(0, "chars");
        return c && c->is_string() ? c->get<std::string>() : std::string();
      };
      if (m == "strip") return strip_chars(s, opt_chars(), true, true);
      if (m == "lstrip") return strip_chars(s, opt_chars(), true, false);
      if (m == "rstrip") return strip_chars(s, opt_chars(), false, true);
      if (m == "upper") return upper(s);
      if (m == "lower") return lower(s);
      if (m == "title") return title(s);
      if (m == "capitalize") return s.empty() ? s : upper(s.substr(0, 1)) + lower(s.substr(1));
      if (m == "startswith" || m == "endswith") {
        const value* p = a.get(0, "prefix");
        if (p == nullptr) fail(m + "() needs an argument");
        auto test = [&](const std::string& x) {
          return m == "startswith" ? s.starts_with(x) : s.ends_with(x);
        };
        if (p->is_array())
          return std::any_of(p->begin(), p->end(), [&](const value& x) {
            return x.is_string() && test(x.get<std::string>());
          });
        if (!p->is_string()) fail(m + "() needs a string");
        return test(p->get<std::string>());
      }
      if (m == "replace") {
        const value* c = a.get(2, "count");
        return replace_all(s, str_arg(a, 0, "old", "replace"), str_arg(a, 1, "new", "replace"),
                           c && c->is_number_integer() ? c->get<int64_t>() : -1);
      }
      if (m == "split") {
        value out = value::array();
        const value* sep = a.get(0, "sep");
        const value* mx = a.get(1, "maxsplit");
        int64_t left = mx && mx->is_number_integer() ? mx->get<int64_t>() : -1;
        if (sep == nullptr || sep->is_null()) {
          size_t i = 0;
          while (i < s.size()) {
            while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
            if (i >= s.size()) break;
            size_t j = i;
            if (left == 0)
              j = s.size();
            else
              while (j < s.size() && !std::isspace(static_cast<unsigned char>(s[j]))) ++j;
            out.push_back(left == 0 ? strip_chars(s.substr(i), "", false, true)
                                    : s.substr(i, j - i));
            --left;
            i = j;
          }
          return out;
        }
        const std::string d = str_arg(a, 0, "sep", "split");
        if (d.empty()) fail("split: empty separator");
        size_t i = 0;
        while (true) {
          const size_t j = left == 0 ? std::string::npos : s.find(d, i);
          if (j == std::string::npos) {
            out.push_back(s.substr(i));
            return out;
          }
          out.push_back(s.substr(i, j - i));
          --left;
          i = j + d.size();
        }
      }
      if (m == "find") {
        const size_t p = s.find(str_arg(a, 0, "sub", "find"));
        return p == std::string::npos ? int64_t{-1} : static_cast<int64_t>(p);
      }
      if (m == "count") {
        const std::string sub = str_arg(a, 0, "sub", "count");
        int64_t n = 0;
        for (size_t p = sub.empty() ? std::string::npos : s.find(sub); p != std::string::npos;
             p = s.find(sub, p + sub.size()))
          ++n;
        return n;
      }
      if (m == "join") {
        const value* xs = a.get(0, "iterable");
        if (xs == nullptr) fail("join() needs an argument");
        std::string out;
        bool first = true;
        for (const auto& x : items_of(*xs)) {
          out += (first ? "" : s) + py_str(x);
          first = false;
        }
        return out;
      }
    }
    if (obj.is_object()) {
      if (m == "items") {
        value out = value::array();
        for (const auto& [k, v] : obj.items()) out.push_back(value::array({value(k), v}));
        return out;
      }
      if (m == "keys") {
        value out = value::array();
        for (const auto& [k, v] : obj.items()) out.push_back(value(k));
        return out;
      }
      if (m == "values") {
        value out = value::array();
        for (const auto& [k, v] : obj.items()) out.push_back(v);
        return out;
      }
      if (m == "get") {
        const value* k = a.get(0, "key");
        if (k && k->is_string() && obj.contains(k->get<std::string>()))
          return obj[k->get<std::string>()];
        const value* d = a.get(1, "default");
        return d ? *d : value(nullptr);
      }
    }
    fail("unsupported method " + m + "() on " +
         (is_undefined(obj) ? std::string("an undefined value") : py_repr(obj).substr(0, 40)));
  }

  value call_macro(const node& m, const call_args& a) {
    scope_guard g(*this);
    for (size_t i = 0; i < m.params.size(); ++i) {
      const value* v = a.get(i, m.params[i].first.c_str());
      scopes_.back()[m.params[i].first] = v                    ? *v
                                          : m.params[i].second ? eval(*m.params[i].second)
                                                               : undefined();
    }
    std::string saved;
    saved.swap(out);
    run(*m.body);
    std::string produced;
    produced.swap(out);
    out = std::move(saved);
    return produced;
  }

  value call(const expr& e) {
    const call_args a = args_of(e);
    if (e.a->kind == expr::attr) return method(eval(*e.a->a), e.a->id, a);
    if (e.a->kind != expr::name) fail("only functions, macros and methods can be called");
    const std::string& f = e.a->id;
    if (auto it = macros_.find(f); it != macros_.end()) return call_macro(*it->second.n, a);
    if (f == "raise_exception") {
      const value* msg = a.get(0, "message");
      throw raised(msg ? py_str(*msg) : "raise_exception()");
    }
    if (f == "range") {
      std::vector<int64_t> xs;
      for (const auto& v : a.pos) {
        if (!v.is_number_integer()) fail("range() needs integers");
        xs.push_back(v.get<int64_t>());
      }
      int64_t lo = 0, hi = 0, step = 1;
      if (xs.size() == 1)
        hi = xs[0];
      else if (xs.size() >= 2)
        lo = xs[0], hi = xs[1];
      if (xs.size() == 3) step = xs[2];
      if (step == 0 || xs.empty() || xs.size() > 3)
        fail("range() needs 1 to 3 arguments, step not 0");
      value out = value::array();
      for (int64_t i = lo; step > 0 ? i < hi : i > hi; i += step) {
        tick();
        out.push_back(i);
      }
      return out;
    }
    if (f == "namespace" || f == "dict") {
      value out = value::object();
      for (const auto& [k, v] : a.kw) out[k] = v;
      return out;
    }
    if (f == "strftime_now") {
      const std::time_t t = std::time(nullptr);
      std::tm tm{};
      gmtime_r(&t, &tm);
      char buf[256];
      const size_t n =
          std::strftime(buf, sizeof buf, str_arg(a, 0, "format", "strftime_now").c_str(), &tm);
      return std::string(buf, n);
    }
    fail("unknown function " + f + "()");
  }

  bool test(const std::string& t, const value& v, const call_args& a) {
    auto arg = [&]() -> const value& {
      if (a.pos.empty()) fail("test '" + t + "' needs an argument");
      return a.pos[0];
    };
    if (t == "defined") return !is_undefined(v);
    if (t == "undefined") return is_undefined(v);
    if (t == "none") return v.is_null();
    if (t == "boolean") return v.is_boolean();
    if (t == "true") return v.is_boolean() && v.get<bool>();
    if (t == "false") return v.is_boolean() && !v.get<bool>();
    if (t == "integer") return v.is_number_integer();
    if (t == "float") return v.is_number_float();
    if (t == "number") return v.is_number();
    if (t == "string") return v.is_string();
    if (t == "mapping") return v.is_object();
    if (t == "sequence" || t == "iterable") return v.is_array() || v.is_string() || v.is_object();
    if (t == "callable") return false;
    if (t == "eq" || t == "equalto" || t == "sameas") return equal(v, arg());
    if (t == "ne") return !equal(v, arg());
    if (t == "lt" || t == "lessthan") return less(v, arg());
    if (t == "gt" || t == "greaterthan") return less(arg(), v);
    if (t == "le") return !less(arg(), v);
    if (t == "ge") return !less(v, arg());
    if (t == "in") return contains(arg(), v);
    if (t == "odd" || t == "even") {
      if (!v.is_number_integer()) fail("test '" + t + "' needs an integer");
      return (v.get<int64_t>() % 2 != 0) == (t == "odd");
    }
    if (t == "divisibleby")
      return v.is_number_integer() && arg().is_number_integer() && arg().get<int64_t>() != 0 &&
             v.get<int64_t>() % arg().get<int64_t>() == 0;
    if (t == "lower") return v.is_string() && lower(v.get<std::string>()) == v.get<std::string>();
    if (t == "upper") return v.is_string() && upper(v.get<std::string>()) == v.get<std::string>();
    fail("unknown test '" + t + "'");
  }

  value attribute_of(const value& v, const std::string& path) {
    value cur = v;
    size_t i = 0;
    while (i <= path.size()) {
      const size_t j = std::min(path.find('.', i), path.size());
      const std::string part = path.substr(i, j - i);
      if (!part.empty() && std::all_of(part.begin(), part.end(), ::isdigit))
        cur = subscript(cur, value(std::stoll(part)));
      else
        cur = subscript(cur, value(part));
      i = j + 1;
    }
    return cur;
  }

  value filter(const std::string& f, const value& v, const call_args& a) {
    if (f == "trim") {
      const value* c = a.get(0, "chars");
      return strip_chars(py_str(v), c && c->is_string() ? c->get<std::string>() : "", true, true);
    }
    if (f == "upper") return upper(py_str(v));
    if (f == "lower") return lower(py_str(v));
    if (f == "title") return title(py_str(v));
    if (f == "capitalize") {
      const std::string s = py_str(v);
      return s.empty() ? s : upper(s.substr(0, 1)) + lower(s.substr(1));
    }
    if (f == "length" || f == "count") {
      if (v.is_string()) return static_cast<int64_t>(v.get_ref<const std::string&>().size());
      if (v.is_array() || v.is_object()) return static_cast<int64_t>(v.size());
      if (is_undefined(v)) return int64_t{0};
      fail("length of " + py_repr(v));
    }
    if (f == "first" || f == "last") {
      const value xs = items_of(v);
      if (xs.empty()) return undefined();
      return f == "first" ? xs.front() : xs.back();
    }
    if (f == "join") {
      const value* sep = a.get(0, "d");
      const value* attr = a.get(1, "attribute");
      std::string out;
      bool first = true;
      for (const auto& x : items_of(v)) {
        out += (first                     ? ""
                : sep && sep->is_string() ? sep->get<std::string>()
                                          : "") +
               py_str(attr && attr->is_string() ? attribute_of(x, attr->get<std::string>()) : x);
        first = false;
      }
      return out;
    }
    if (f == "default" || f == "d") {
      const value* dflt = a.get(0, "default_value");
      const value* boolean = a.get(1, "boolean");
      const bool use = is_undefined(v) || (boolean && truthy(*boolean) && !truthy(v));
      return use ? (dflt ? *dflt : value("")) : v;
    }
    if (f == "string") return py_str(v);
    if (f == "safe") return v;
    if (f == "int") {
      if (v.is_number_integer()) return v;
      if (v.is_number()) {
        const double d = v.get<double>();
        if (!(std::fabs(d) < 9.0e18)) fail("int(): " + py_float(d) + " is out of range");
        return static_cast<int64_t>(d);
      }
      if (v.is_string()) {
        try {
          return static_cast<int64_t>(std::stoll(v.get<std::string>()));
        } catch (...) {
          return int64_t{0};
        }
      }
      return int64_t{0};
    }
    if (f == "float") {
      if (v.is_number()) return v.get<double>();
      if (v.is_string()) {
        try {
          return std::stod(v.get<std::string>());
        } catch (...) {
          return 0.0;
        }
      }
      return 0.0;
    }
    if (f == "abs")
      return v.is_number_integer() && v.get<int64_t>() != INT64_MIN
                 ? value(std::llabs(v.get<int64_t>()))
                 : value(std::fabs(num(v, "abs")));
    if (f == "list") return items_of(v);
    if (f == "items") return method(v.is_object() ? v : value::object(), "items", {});
    if (f == "reverse") {
      if (v.is_string()) {
        std::string s = v.get<std::string>();
        std::reverse(s.begin(), s.end());
        return s;
      }
      value xs = items_of(v);
      std::reverse(xs.begin(), xs.end());
      return xs;
    }
    if (f == "replace")
      return replace_all(py_str(v), str_arg(a, 0, "old", "replace"),
                         str_arg(a, 1, "new", "replace"));
    if (f == "tojson") {
      const value* ind = a.get(0, "indent");
      std::string out;
      json_dump(v, ind && ind->is_number_integer() ? static_cast<int>(ind->get<int64_t>()) : -1, 0,
                out);
      return out;
    }
    if (f == "indent") {
      const value* w = a.get(0, "width");
      const value* first = a.get(1, "first");
      const std::string pad(
          w && w->is_number_integer() ? static_cast<size_t>(w->get<int64_t>()) : 4, ' ');
      const std::string s = py_str(v);
      std::string out;
      for (size_t i = 0; i < s.size(); ++i) {
        out += s[i];
        if (s[i] == '\n' && i + 1 < s.size() && s[i + 1] != '\n') out += pad;
      }
      return (first && truthy(*first) ? pad : "") + out;
    }
    if (f == "map" || f == "selectattr" || f == "rejectattr" || f == "select" || f == "reject") {
      value out = value::array();
      for (const auto& x : items_of(v)) {
        if (f == "map") {
          const value* attr = a.get(99, "attribute");
          if (attr && attr->is_string()) {
            value y = attribute_of(x, attr->get<std::string>());
            if (is_undefined(y)) {
              const value* d = a.get(99, "default");
              if (d) y = *d;
            }
            out.push_back(y);
          } else if (!a.pos.empty() && a.pos[0].is_string()) {
            call_args rest;
            rest.pos.assign(a.pos.begin() + 1, a.pos.end());
            out.push_back(filter(a.pos[0].get<std::string>(), x, rest));
          } else {
            fail("map() needs attribute= or a filter name");
          }
          continue;
        }
        const bool by_attr = f == "selectattr" || f == "rejectattr";
        size_t k = 0;
        value subject = x;
        if (by_attr) {
          if (a.pos.empty() || !a.pos[0].is_string()) fail(f + "() needs an attribute name");
          subject = attribute_of(x, a.pos[0].get<std::string>());
          k = 1;
        }
        bool ok;
        if (a.pos.size() > k) {
          if (!a.pos[k].is_string()) fail(f + "() needs a test name");
          call_args targs;
          targs.pos.assign(a.pos.begin() + static_cast<ptrdiff_t>(k) + 1, a.pos.end());
          ok = test(a.pos[k].get<std::string>(), subject, targs);
        } else {
          ok = truthy(subject);
        }
        if (ok == (f == "selectattr" || f == "select")) out.push_back(x);
      }
      return out;
    }
    if (f == "unique") {
      value out = value::array();
      for (const auto& x : items_of(v)) {
        if (!std::any_of(out.begin(), out.end(), [&](const value& y) { return equal(x, y); }))
          out.push_back(x);
      }
      return out;
    }
    if (f == "sort") {
      value xs = items_of(v);
      const value* rev = a.get(0, "reverse");
      const value* attr = a.get(2, "attribute");
      std::vector<value> vs(xs.begin(), xs.end());
      auto key = [&](const value& x) {
        return attr && attr->is_string() ? attribute_of(x, attr->get<std::string>()) : x;
      };
      std::stable_sort(vs.begin(), vs.end(),
                       [&](const value& p, const value& q) { return less(key(p), key(q)); });
      if (rev && truthy(*rev)) std::reverse(vs.begin(), vs.end());
      return value(vs);
    }
    if (f == "wordcount") {
      return static_cast<int64_t>(method(value(py_str(v)), "split", {}).size());
    }
    fail("unknown filter '" + f + "'");
  }

 public:
  value eval(const expr& e) {
    switch (e.kind) {
      case expr::literal:
        return e.lit;
      case expr::name: {
        if (value* v = find_var(e.id)) return *v;
        return undefined();
      }
      case expr::list: {
        value out = value::array();
        for (const auto& x : e.args) out.push_back(eval(*x));
        return out;
      }
      case expr::dict: {
        value out = value::object();
        for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
          const value k = eval(*e.args[i]);
          if (!k.is_string()) fail("dict keys must be strings");
          out[k.get<std::string>()] = eval(*e.args[i + 1]);
        }
        return out;
      }
      case expr::attr: {
        const value obj = eval(*e.a);
        if (is_undefined(obj))
          fail("'" + describe(*e.a) + "' is undefined (reading ." + e.id + ")");
        return subscript(obj, value(e.id));
      }
      case expr::index: {
        const value obj = eval(*e.a);
        if (is_undefined(obj)) fail("'" + describe(*e.a) + "' is undefined (subscripted)");
        return subscript(obj, eval(*e.b));
      }
      case expr::slice:
        return slice(eval(*e.a), e.args[0] ? eval(*e.args[0]) : value(),
                     e.args[1] ? eval(*e.args[1]) : value(),
                     e.args[2] ? eval(*e.args[2]) : value());
      case expr::call:
        return call(e);
      case expr::filter:
        return filter(e.id, eval(*e.a), args_of(e));
      case expr::test:
        return test(e.id, eval(*e.a), args_of(e)) != e.negate;
      case expr::unary: {
        const value v = eval(*e.a);
        if (e.id == "not") return !truthy(v);
        if (e.id == "-")
          return v.is_number_integer() && v.get<int64_t>() != INT64_MIN ? value(-v.get<int64_t>())
                                                                        : value(-num(v, "-"));
        return v;
      }
      case expr::binary:
        return binary(e.id, e);
      case expr::ternary:
        return truthy(eval(*e.b)) ? eval(*e.a) : (e.c ? eval(*e.c) : undefined());
    }
    return undefined();
  }

 private:
  static std::string describe(const expr& e) {
    if (e.kind == expr::name) return e.id;
    if (e.kind == expr::attr) return describe(*e.a) + "." + e.id;
    if (e.kind == expr::index) return describe(*e.a) + "[...]";
    return "value";
  }

  std::vector<std::map<std::string, value>> scopes_;
  std::map<std::string, macro_def> macros_;
  int64_t iterations_ = 0;
};

}  // namespace

result<template_text> template_text::parse(std::string_view source) {
  // jinja2 drops one newline at the end of a template (keep_trailing_newline is off).
  if (source.ends_with("\r\n"))
    source.remove_suffix(2);
  else if (source.ends_with("\n"))
    source.remove_suffix(1);
  try {
    template_text t;
    t.root_ = parse_template(source);
    return t;
  } catch (const std::exception& e) {
    return status{status_code::invalid_argument, std::string("chat template: ") + e.what()};
  }
}

result<std::string> template_text::render(const value& context) const {
  if (!root_) return status{status_code::internal, "chat template: not parsed"};
  try {
    renderer r(context);
    r.run(*root_);
    return std::move(r.out);
  } catch (const std::exception& e) {  // jinja_error, raise_exception(), JSON errors
    return status{status_code::invalid_argument, std::string("chat template: ") + e.what()};
  }
}

}  // namespace weft::gpu::jinja
