#pragma once
// The syntax tree of a Jinja template (gpu/jinja.hpp), shared by its parser (jinja_parse.cpp) and
// renderer (jinja.cpp). Internal: not installed as part of the SDK's stable headers.
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "gpu/jinja.hpp"

namespace weft::gpu::jinja {

/// Errors while parsing or rendering (caught at the API: never escape it).
struct jinja_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

[[noreturn]] inline void fail(const std::string& what) {
  throw jinja_error(what);
}

struct expr;
using expr_ptr = std::shared_ptr<const expr>;

struct expr {
  enum kind_t {
    literal,
    name,
    list,
    dict,
    attr,
    index,
    slice,
    call,
    filter,
    test,
    unary,
    binary,
    ternary
  } kind;
  explicit expr(kind_t k) : kind(k) {}
  value lit;                   // literal
  std::string id;              // name, attr, filter/test name, operator
  std::vector<expr_ptr> args;  // operands, list items, dict k/v pairs, call/filter args
  std::vector<std::pair<std::string, expr_ptr>> kwargs;
  expr_ptr a, b, c;     // target/operands
  bool negate = false;  // `is not`
};

using node_ptr = std::shared_ptr<const node>;

struct node {
  enum kind_t { text_node, output, block, if_, for_, set, macro, brk, cont } kind = block;
  std::string text;                                   // text
  expr_ptr e;                                         // output, set value, for iterable
  std::vector<std::shared_ptr<const node>> children;  // block
  std::vector<std::pair<expr_ptr, std::shared_ptr<const node>>> branches;  // if (cond, body)
  std::shared_ptr<const node> body, else_body;                             // for, macro
  std::vector<std::string> targets;                      // for targets, set target (name[, attr])
  expr_ptr cond;                                         // for ... if cond
  std::vector<std::pair<std::string, expr_ptr>> params;  // macro parameters (default or null)
  int line = 0;
};

/// Parses a template (whitespace control and trim/lstrip blocks applied); throws jinja_error.
node_ptr parse_template(std::string_view source);

}  // namespace weft::gpu::jinja
