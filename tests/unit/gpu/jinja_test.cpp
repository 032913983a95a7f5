// weft's Jinja engine (gpu/jinja.hpp) without Python: whitespace control, the operators and
// filters chat templates use, raise_exception, errors that name the problem, limits that stop a
// hostile template, and chat_template running a model's own template (BOS not doubled). The
// broad comparison with jinja2 is the oracle test (tests/oracle/gpu/test_jinja.py).
#include <gtest/gtest.h>

#include <string>

#include "gpu/chat_template.hpp"
#include "gpu/gguf.hpp"
#include "gpu/gguf_writer.hpp"
#include "gpu/jinja.hpp"
#include "gpu/tiny_model.hpp"
#include "gpu/tokenizer.hpp"

namespace weft::gpu {
namespace {

using jinja::template_text;
using jinja::value;

std::string render(const std::string& src, const value& ctx = value::object()) {
  auto t = template_text::parse(src);
  EXPECT_TRUE(t.ok()) << t.error().message();
  if (!t.ok()) return "<parse error>";
  auto r = t->render(ctx);
  EXPECT_TRUE(r.ok()) << r.error().message();
  return r.ok() ? *r : "<render error>";
}

std::string error_of(const std::string& src, const value& ctx = value::object()) {
  auto t = template_text::parse(src);
  if (!t.ok()) return t.error().message();
  auto r = t->render(ctx);
  return r.ok() ? std::string() : r.error().message();
}

TEST(jinja, whitespace_control_as_hugging_face_sets_it) {
  // trim_blocks: the newline after a block tag goes; lstrip_blocks: indentation before it goes.
  EXPECT_EQ(render("{% if true %}\n  a\n  {% endif %}\nb"), "  a\nb");
  EXPECT_EQ(render("x  {%- if true -%}  y  {%- endif -%}  z"), "xyz");
  EXPECT_EQ(render("a\n  {{ 1 }}\n"), "a\n  1");  // expressions keep indentation; last \n dropped
  EXPECT_EQ(render("  {%+ if true %}k{% endif %}"), "  k");
  EXPECT_EQ(render("{# note #}\nA{# x #}B"), "AB");
}

TEST(jinja, expressions_filters_and_loops) {
  const value ctx = value::parse(R"({"messages": [{"role": "user", "content": " Hi "},
      {"role": "assistant", "content": ""}], "n": 7})");
  EXPECT_EQ(render("{% for m in messages %}{{ loop.index }}:{{ m.role }}={{ m.content | trim | "
                   "default('-', true) }}{{ ',' if not loop.last }}{% endfor %}",
                   ctx),
            "1:user=Hi,2:assistant=-");
  EXPECT_EQ(render("{{ n // 2 }} {{ n % 4 }} {{ n / 2 }} {{ 'a' ~ n }} {{ n is odd }}", ctx),
            "3 3 3.5 a7 True");
  EXPECT_EQ(render("{% set ns = namespace(c=0) %}{% for m in messages %}{% set ns.c = ns.c + 1 "
                   "%}{% endfor %}{{ ns.c }}",
                   ctx),
            "2");
  EXPECT_EQ(render("{{ messages | map(attribute='role') | join('|') }} {{ messages[-1].role }} "
                   "{{ messages[1:] | length }}",
                   ctx),
            "user|assistant assistant 1");
  EXPECT_EQ(render("{{ {'b': 1, 'a': [true, none]} | tojson }}"), R"({"b": 1, "a": [true, null]})");
  EXPECT_EQ(render("{% macro t(x, y='!') %}<{{ x }}{{ y }}>{% endmacro %}{{ t('a') }}{{ t('b', "
                   "y='?') }}"),
            "<a!><b?>");
  EXPECT_EQ(render("{{ 'a<b>c'.split('<')[1].split('>')[0] }} {{ 'xy'.startswith(('q', 'x')) }}"),
            "b True");
}

TEST(jinja, raise_exception_and_errors_name_the_problem) {
  EXPECT_EQ(error_of("{{ raise_exception('roles must alternate') }}"),
            "chat template: roles must alternate");
  EXPECT_NE(error_of("a\nb {% if x %}").find("missing 'endif'"), std::string::npos);
  EXPECT_NE(error_of("line1\n{{ 1 + }}").find("line 2"), std::string::npos);
  EXPECT_NE(error_of("{% include 'x' %}").find("unsupported statement 'include'"),
            std::string::npos);
  EXPECT_NE(error_of("{{ x | frobnicate }}").find("unknown filter 'frobnicate'"),
            std::string::npos);
  EXPECT_NE(error_of("{{ missing.attr }}").find("'missing' is undefined"), std::string::npos);
  EXPECT_NE(error_of("{{ 'unterminated }}").find("unclosed tag"), std::string::npos);
}

TEST(jinja, hostile_templates_stop_with_an_error) {
  EXPECT_NE(error_of("{% for i in range(100000000) %}x{% endfor %}").find("million"),
            std::string::npos);
  EXPECT_NE(error_of("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}").find("deeper"),
            std::string::npos);
  EXPECT_NE(error_of("{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}")
                .find("nested deeper"),
            std::string::npos);
  EXPECT_NE(error_of("{% set s = 'x' * 1000000 %}{% for i in range(100) %}{{ s }}{% endfor %}")
                .find("16 MiB"),
            std::string::npos);
}

TEST(chat_template, runs_the_models_own_template_and_does_not_double_bos) {
  tiny_model_config c;
  auto img = make_tiny_model(c);
  ASSERT_TRUE(img.ok());
  auto f = gguf_file::parse(*img);
  ASSERT_TRUE(f.ok());
  auto t = chat_template::from_gguf(*f);
  ASSERT_TRUE(t.ok()) << t.error().message();
  EXPECT_TRUE(t->runs_jinja());
  EXPECT_EQ(t->describe(), "jinja");
  // A template file that writes bos_token first: the tokenizer adds BOS itself when the model says
  // so, so the rendered text must not start with it again.
  auto own = chat_template::from_jinja(
      "{{ bos_token }}{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}", &*f);
  ASSERT_TRUE(own.ok()) << own.error().message();
  const std::vector<chat_message> msgs{{"user", "hi"}};
  auto text = own->apply(msgs);
  ASSERT_TRUE(text.ok());
  auto tok = tokenizer::from_gguf(*f);
  ASSERT_TRUE(tok.ok());
  ASSERT_TRUE(tok->bos().has_value());
  const std::string bos(tok->token_text(*tok->bos()));
  EXPECT_EQ(*text, (tok->adds_bos() ? "" : bos) + "[user]hi");
  // A template that raises on the probe conversation is refused with its message.
  auto strict = chat_template::from_jinja(
      "{% if messages | length > 1 %}{{ raise_exception('one message only') }}{% endif %}", &*f);
  ASSERT_FALSE(strict.ok());
  EXPECT_NE(strict.error().message().find("one message only"), std::string::npos);
  // A named native format is still available.
  auto named = chat_template::from_gguf(*f, "llama3");
  ASSERT_TRUE(named.ok());
  EXPECT_FALSE(named->runs_jinja());
}

}  // namespace
}  // namespace weft::gpu
