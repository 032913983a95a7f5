#pragma once
/// The subset of Jinja2 that chat templates use (docs/serving.md, "Chat templates"), so a model's
/// own tokenizer.chat_template renders as Hugging Face's apply_chat_template renders it: jinja2
/// with trim_blocks and lstrip_blocks, its own `tojson` (key order kept, non-ASCII kept) and
/// `raise_exception`. No C++ Jinja library is packaged for Debian; this is written for weft.
///
/// Supported: text, {{ }}, {% %}, {# #} with whitespace control (-); if/elif/else, for (tuple
/// targets, `if` filter, else, loop.index/index0/revindex/revindex0/first/last/length/previtem/
/// nextitem), break/continue, set (also `ns.attr`), macro (call with positional and keyword
/// arguments), generation blocks; literals, lists, dicts, attribute/subscript/slice, calls, the
/// operators of Jinja (or and not in is ~ + - * / // % ** comparisons, `x if c else y`); the
/// filters and tests, global functions (range, namespace, raise_exception, strftime_now, dict)
/// and string/dict/list methods (strip, split, startswith, items, get, ...) that templates use.
/// Anything else is a parse or render error naming it. Values are JSON values; loops and output
/// are bounded, so a hostile template fails instead of hanging.

#include <memory>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "gpu/status.hpp"

namespace weft::gpu::jinja {

using value = nlohmann::ordered_json;

struct node;

class template_text {
 public:
  /// Parses `source` (trim_blocks and lstrip_blocks on, as Hugging Face sets them).
  static result<template_text> parse(std::string_view source);
  /// Renders with `context` (an object: its keys are the template's variables). A
  /// raise_exception() in the template is an invalid_argument error with its message.
  result<std::string> render(const value& context) const;

 private:
  std::shared_ptr<const node> root_;
};

}  // namespace weft::gpu::jinja
