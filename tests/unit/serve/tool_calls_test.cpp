// Tool calling (actors/serve/tool_calls.hpp): reading tools and tool_choice, the prompt text, the
// grammar of a required call, and the parser that splits output into content and calls — whole
// and streamed in pieces of every size.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "actors/serve/openai_api.hpp"
#include "actors/serve/tool_calls.hpp"
#include "gpu/grammar.hpp"

namespace weft::serve {
namespace {

using ojson = nlohmann::ordered_json;

const char* kTools = R"([
  {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
   "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                  "unit": {"enum": ["c", "f"]}}, "required": ["city"]}}},
  {"type": "function", "function": {"name": "add", "parameters": {"type": "object",
   "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}}
])";

tool_config config(const std::string& extra = "") {
  tool_config t;
  const auto body = ojson::parse(std::string(R"({"tools": )") + kTools + extra + "}");
  auto e = read_tool_config(body, t);
  EXPECT_FALSE(e.has_value()) << e->param << ": " << e->message;
  return t;
}

std::optional<tool_error> error_of(const std::string& body) {
  tool_config t;
  return read_tool_config(ojson::parse(body), t);
}

TEST(tool_config, reads_tools_choice_and_parallel) {
  auto t = config();
  ASSERT_EQ(t.tools.size(), 2u);
  EXPECT_EQ(t.tools[0].name, "get_weather");
  EXPECT_EQ(t.tools[0].description, "Weather in a city");
  EXPECT_EQ(t.tools[1].parameters["required"], ojson::parse(R"(["a","b"])"));
  EXPECT_EQ(t.choice, tool_choice::automatic);
  EXPECT_TRUE(t.parallel);
  EXPECT_TRUE(t.active());
  EXPECT_EQ(config(R"(, "tool_choice": "none")").choice, tool_choice::none);
  EXPECT_FALSE(config(R"(, "tool_choice": "none")").active());
  EXPECT_EQ(config(R"(, "tool_choice": "required")").choice, tool_choice::required);
  auto named = config(R"(, "tool_choice": {"type": "function", "function": {"name": "add"}})");
  EXPECT_EQ(named.choice, tool_choice::named);
  EXPECT_EQ(named.named, "add");
  EXPECT_FALSE(config(R"(, "parallel_tool_calls": false)").parallel);
  tool_config none;
  EXPECT_FALSE(read_tool_config(ojson::parse(R"({"messages": []})"), none).has_value());
  EXPECT_FALSE(none.active());
}

TEST(tool_config, refuses_what_it_cannot_use_naming_the_field) {
  auto expect = [](const std::string& body, const std::string& param, const std::string& says) {
    auto e = error_of(body);
    ASSERT_TRUE(e.has_value()) << body;
    EXPECT_EQ(e->param, param) << body;
    EXPECT_NE(e->message.find(says), std::string::npos) << e->message;
  };
  expect(R"({"tools": {}})", "tools", "must be a list");
  expect(R"({"tools": [{"type": "function"}]})", "tools[0].function", "required");
  expect(R"({"tools": [{"type": "retrieval", "function": {"name": "f"}}]})", "tools[0].type",
         "'function'");
  expect(R"({"tools": [{"function": {"name": "bad name!"}}]})", "tools[0].function.name",
         "letters");
  expect(R"({"tools": [{"function": {"name": "f"}}, {"function": {"name": "f"}}]})",
         "tools[1].function.name", "twice");
  expect(R"({"tools": [{"function": {"name": "f", "parameters": []}}]})",
         "tools[0].function.parameters", "JSON Schema");
  expect(R"({"tool_choice": "required"})", "tool_choice", "'tools' is empty");
  expect(R"({"tools": [{"function": {"name": "f"}}], "tool_choice": {"type": "function",
          "function": {"name": "g"}}})",
         "tool_choice", "not in 'tools'");
  expect(R"({"tools": [{"function": {"name": "f"}}], "tool_choice": 3})", "tool_choice",
         "string or an object");
  expect(R"({"tools": [{"function": {"name": "f"}}], "parallel_tool_calls": "yes"})",
         "parallel_tool_calls", "boolean");
  expect(R"({"tools": [{"function": {"name": "f", "strict": true}}]})", "tools",
         "enforced only when a call is required");
  EXPECT_FALSE(error_of(R"({"tools": [{"function": {"name": "f", "strict": true}}],
                            "tool_choice": "required"})")
                   .has_value());
}

TEST(tool_calls, the_prompt_lists_the_tools_in_the_system_turn) {
  auto t = config(R"(, "tool_choice": {"type": "function", "function": {"name": "add"}})");
  std::vector<gpu::chat_message> msgs{{"user", "hi"}};
  add_tools_to_messages(t, msgs);
  ASSERT_EQ(msgs.size(), 2u);
  EXPECT_EQ(msgs[0].role, "system");
  EXPECT_NE(msgs[0].content.find("<tools>\n{\"type\":\"function\",\"function\":{\"name\":"
                                 "\"get_weather\",\"description\":\"Weather in a city\""),
            std::string::npos)
      << msgs[0].content;
  EXPECT_NE(msgs[0].content.find("You must call add."), std::string::npos);
  std::vector<gpu::chat_message> with_system{{"system", "Be brief."}, {"user", "hi"}};
  add_tools_to_messages(t, with_system);
  ASSERT_EQ(with_system.size(), 2u);
  EXPECT_TRUE(with_system[0].content.ends_with("\n\nBe brief."));
  auto off = config(R"(, "tool_choice": "none")");
  std::vector<gpu::chat_message> untouched{{"user", "hi"}};
  add_tools_to_messages(off, untouched);
  EXPECT_EQ(untouched.size(), 1u);
}

TEST(tool_calls, parses_calls_and_keeps_everything_else_as_content) {
  auto t = config();
  auto o = parse_tool_output(
      "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
      "\"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"add\", \"arguments\": \"{\\\"a\\\": 1, "
      "\\\"b\\\": 2}\"}\n</tool_call>\n",
      t, "call_x_0_");
  EXPECT_EQ(o.content, "Let me check.");
  ASSERT_EQ(o.calls.size(), 2u);
  EXPECT_EQ(o.calls[0].id, "call_x_0_0");
  EXPECT_EQ(o.calls[0].index, 0);
  EXPECT_EQ(o.calls[0].name, "get_weather");
  EXPECT_EQ(o.calls[0].arguments, R"({"city":"Paris"})");
  EXPECT_EQ(o.calls[1].name, "add");
  EXPECT_EQ(o.calls[1].arguments, R"({"a":1,"b":2})");  // a JSON string of arguments is accepted
  // Plain text, an unknown tool, broken JSON, an unfinished block: content, as written.
  EXPECT_EQ(parse_tool_output("Just text.\n", t, "c").content, "Just text.\n");
  const std::string unknown = "<tool_call>{\"name\": \"rm\", \"arguments\": {}}</tool_call>";
  auto u = parse_tool_output(unknown, t, "c");
  EXPECT_TRUE(u.calls.empty());
  EXPECT_EQ(u.content, unknown);
  EXPECT_EQ(parse_tool_output("<tool_call>{\"name\": ", t, "c").content, "<tool_call>{\"name\": ");
  EXPECT_EQ(parse_tool_output("a <tool_call>{oops}</tool_call> b", t, "c").content,
            "a <tool_call>{oops}</tool_call> b");
  // "parameters" (Llama-style) is read as the arguments; none at all is {}.
  auto p = parse_tool_output(
      "<tool_call>{\"name\": \"add\", \"parameters\": {\"a\": 1, \"b\": "
      "2}}</tool_call><tool_call>{\"name\": \"get_weather\"}</tool_call>",
      t, "c");
  ASSERT_EQ(p.calls.size(), 2u);
  EXPECT_EQ(p.calls[0].arguments, R"({"a":1,"b":2})");
  EXPECT_EQ(p.calls[1].arguments, "{}");
}

TEST(tool_calls, streamed_in_any_pieces_gives_the_same_split) {
  auto t = config();
  const std::string text =
      "Sure <tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 2, \"b\": 3}}\n</tool_call>\n"
      "<tool_cal and <tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}"
      "</tool_call> <tool";
  const auto whole = parse_tool_output(text, t, "id");
  ASSERT_EQ(whole.calls.size(), 2u);
  for (size_t step = 1; step <= text.size(); ++step) {
    tool_call_parser p(t, "id");
    tool_call_parser::output all;
    for (size_t i = 0; i < text.size(); i += step) {
      auto o = p.feed(std::string_view(text).substr(i, step));
      // Never shows part of a tag as content.
      EXPECT_EQ(o.content.find("<tool_call"), std::string::npos) << step;
      all.content += o.content;
      for (auto& c : o.calls) all.calls.push_back(c);
    }
    auto f = p.finish();
    all.content += f.content;
    EXPECT_EQ(all.content, whole.content) << "piece size " << step;
    ASSERT_EQ(all.calls.size(), whole.calls.size());
    for (size_t i = 0; i < all.calls.size(); ++i) {
      EXPECT_EQ(all.calls[i].arguments, whole.calls[i].arguments);
      EXPECT_EQ(all.calls[i].id, whole.calls[i].id);
    }
  }
  EXPECT_EQ(whole.content, "Sure\n<tool_cal and <tool");
}

bool accepts(const std::string& gbnf, const std::string& s) {
  auto g = gpu::grammar::grammar::parse(gbnf);
  EXPECT_TRUE(g.ok()) << g.error().message() << "\n" << gbnf;
  if (!g.ok()) return false;
  gpu::grammar::matcher m(*g);
  return m.advance(s) && m.accepting();
}

TEST(tool_calls, required_and_named_calls_are_enforced_by_a_grammar) {
  auto none = tool_call_grammar(config());
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());  // auto: no constraint
  auto req = tool_call_grammar(config(R"(, "tool_choice": "required")"));
  ASSERT_TRUE(req.ok()) << req.error().message();
  ASSERT_TRUE(req->has_value());
  const std::string add = tool_call_text("add", R"({"a": 1, "b": 2})");
  const std::string weather = tool_call_text("get_weather", R"({"city": "Rome"})");
  EXPECT_TRUE(accepts(**req, add));
  EXPECT_TRUE(accepts(**req, weather + "\n" + add));  // parallel
  EXPECT_FALSE(accepts(**req, "Hello"));
  EXPECT_FALSE(accepts(**req, tool_call_text("rm", "{}")));
  EXPECT_FALSE(accepts(**req, tool_call_text("add", R"({"a": 1})")));  // b is required
  EXPECT_FALSE(accepts(**req, tool_call_text("add", R"({"a": "one", "b": 2})")));
  auto single =
      tool_call_grammar(config(R"(, "tool_choice": "required", "parallel_tool_calls": false)"));
  ASSERT_TRUE(single.ok());
  EXPECT_FALSE(accepts(**single, weather + "\n" + add));
  auto named = tool_call_grammar(
      config(R"(, "tool_choice": {"type": "function", "function": {"name": "get_weather"}})"));
  ASSERT_TRUE(named.ok());
  EXPECT_TRUE(accepts(**named, weather));
  EXPECT_FALSE(accepts(**named, add));
  // Every accepted call parses back into the same call.
  auto back = parse_tool_output(weather, config(), "c");
  ASSERT_EQ(back.calls.size(), 1u);
  EXPECT_EQ(back.calls[0].arguments, R"({"city":"Rome"})");
  // A schema keyword the grammar cannot enforce is refused by name.
  tool_config bad;
  ASSERT_FALSE(read_tool_config(ojson::parse(R"({"tools": [{"function": {"name": "f",
      "parameters": {"type": "object", "properties": {"d": {"type": "string", "format": "date"}}}}}],
      "tool_choice": "required"})"),
                                bad)
                   .has_value());
  auto refused = tool_call_grammar(bad);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().message().find("format"), std::string::npos);
}

tool_config config_in(tool_format f, const std::string& extra = "") {
  tool_config t;
  t.format = f;
  const auto body = ojson::parse(std::string(R"({"tools": )") + kTools + extra + "}");
  EXPECT_FALSE(read_tool_config(body, t).has_value());
  EXPECT_EQ(t.format, f);  // read_tool_config keeps the server's format
  return t;
}

/// The output fed in pieces of every size gives what it gives whole.
tool_call_parser::output parse_in_pieces_of_every_size(const std::string& text,
                                                       const tool_config& t) {
  const auto whole = parse_tool_output(text, t, "id");
  for (size_t step = 1; step <= text.size(); ++step) {
    tool_call_parser p(t, "id");
    tool_call_parser::output all;
    for (size_t i = 0; i < text.size(); i += step) {
      auto o = p.feed(std::string_view(text).substr(i, step));
      all.content += o.content;
      for (auto& c : o.calls) all.calls.push_back(c);
    }
    auto f = p.finish();
    all.content += f.content;
    for (auto& c : f.calls) all.calls.push_back(c);
    EXPECT_EQ(all.content, whole.content) << "piece size " << step;
    EXPECT_EQ(all.calls.size(), whole.calls.size()) << "piece size " << step;
    for (size_t i = 0; i < all.calls.size() && i < whole.calls.size(); ++i) {
      EXPECT_EQ(all.calls[i].name, whole.calls[i].name);
      EXPECT_EQ(all.calls[i].arguments, whole.calls[i].arguments);
      EXPECT_EQ(all.calls[i].id, whole.calls[i].id);
    }
  }
  return whole;
}

TEST(tool_calls, llama3_json_calls_parse_whole_and_streamed) {
  const auto t = config_in(tool_format::llama3_json);
  auto one = parse_in_pieces_of_every_size(R"({"name": "add", "parameters": {"a": 2, "b": 3}})", t);
  ASSERT_EQ(one.calls.size(), 1u);
  EXPECT_EQ(one.calls[0].name, "add");
  EXPECT_EQ(one.calls[0].arguments, R"({"a":2,"b":3})");
  EXPECT_EQ(one.content, "");
  auto two = parse_in_pieces_of_every_size(
      "<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"a;b}\"}}; "
      "{\"name\": \"add\", \"arguments\": \"{\\\"a\\\": 1, \\\"b\\\": 2}\"}",
      t);
  ASSERT_EQ(two.calls.size(), 2u);
  EXPECT_EQ(two.calls[0].arguments, R"({"city":"a;b}"})");  // ';' and '}' inside a string
  EXPECT_EQ(two.calls[1].arguments, R"({"a":1,"b":2})");
  EXPECT_EQ(two.calls[1].id, "id1");
  // Anything else is content, exactly as written.
  for (const std::string& text :
       {std::string("The answer is {\"name\": \"add\"}."),
        std::string("{\"name\": \"rm\", \"parameters\": {}}"),
        std::string("{\"name\": \"add\", \"parameters\": {\"a\": 1}} and more"),
        std::string("{\"name\": \"add\", \"parameters\": {\"a\": 1"), std::string("<|pyth"),
        std::string("  plain text\n")}) {
    auto o = parse_in_pieces_of_every_size(text, t);
    EXPECT_TRUE(o.calls.empty()) << text;
    EXPECT_EQ(o.content, text) << text;
  }
}

TEST(tool_calls, mistral_calls_parse_whole_and_streamed) {
  const auto t = config_in(tool_format::mistral);
  auto o = parse_in_pieces_of_every_size(
      R"(Let me check. [TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Oslo"}, )"
      R"("id": "abc123XYZ"}, {"name": "add", "arguments": {"a": 1, "b": 2}}])",
      t);
  ASSERT_EQ(o.calls.size(), 2u);
  EXPECT_EQ(o.content, "Let me check.");
  EXPECT_EQ(o.calls[0].arguments, R"({"city":"Oslo"})");
  EXPECT_EQ(o.calls[1].name, "add");
  // The forced form (grammar): the array without the marker.
  auto forced =
      parse_in_pieces_of_every_size(R"([{"name": "add", "arguments": {"a": 5, "b": 6}}])", t);
  ASSERT_EQ(forced.calls.size(), 1u);
  EXPECT_EQ(forced.calls[0].arguments, R"({"a":5,"b":6})");
  for (const std::string& text :
       {std::string("[TOOL_CALLS][{\"name\": \"nope\", \"arguments\": {}}]"),
        std::string("[1, 2, 3] are numbers"), std::string("text [TOOL_CALL"),
        std::string("[TOOL_CALLS][{\"name\": \"add\", \"arguments\": {\"a\": 1}")}) {
    auto c = parse_in_pieces_of_every_size(text, t);
    EXPECT_TRUE(c.calls.empty()) << text;
    EXPECT_EQ(c.content, text) << text;
  }
}

TEST(tool_calls, each_format_forces_calls_it_parses_back) {
  struct example {
    tool_format format;
    std::string one, two;
  };
  const std::vector<example> examples = {
      {tool_format::llama3_json, R"({"name": "add", "parameters": {"a": 1, "b": 2}})",
       R"({"name": "get_weather", "parameters": {"city": "Rome"}}; {"name": "add", "parameters": {"a": 1, "b": 2}})"},
      {tool_format::mistral, R"([{"name": "add", "arguments": {"a": 1, "b": 2}}])",
       R"([{"name": "get_weather", "arguments": {"city": "Rome"}}, {"name": "add", "arguments": {"a": 1, "b": 2}}])"},
  };
  for (const auto& e : examples) {
    auto req = tool_call_grammar(config_in(e.format, R"(, "tool_choice": "required")"));
    ASSERT_TRUE(req.ok() && req->has_value()) << tool_format_name(e.format);
    EXPECT_TRUE(accepts(**req, e.one)) << tool_format_name(e.format);
    EXPECT_TRUE(accepts(**req, e.two)) << tool_format_name(e.format);
    EXPECT_FALSE(accepts(**req, "Hello")) << tool_format_name(e.format);
    EXPECT_FALSE(accepts(**req, tool_call_text("add", R"({"a": 1, "b": 2})")));
    auto single = tool_call_grammar(
        config_in(e.format, R"(, "tool_choice": "required", "parallel_tool_calls": false)"));
    EXPECT_FALSE(accepts(**single, e.two)) << tool_format_name(e.format);
    const auto t = config_in(e.format);
    EXPECT_EQ(parse_tool_output(e.one, t, "c").calls.size(), 1u) << tool_format_name(e.format);
    EXPECT_EQ(parse_tool_output(e.two, t, "c").calls.size(), 2u) << tool_format_name(e.format);
  }
  EXPECT_EQ(parse_tool_format("hermes"), tool_format::tagged);
  EXPECT_EQ(parse_tool_format("llama3_json"), tool_format::llama3_json);
  EXPECT_EQ(parse_tool_format("mistral"), tool_format::mistral);
  EXPECT_FALSE(parse_tool_format("pythonic").has_value());
}

TEST(tool_calls, the_format_follows_the_templates_family) {
  auto style = [](const char* src) {
    auto t = gpu::chat_template::from_jinja(src, nullptr);
    EXPECT_TRUE(t.ok()) << t.error().message();
    return tool_format_of(*t);
  };
  EXPECT_EQ(
      style("{% for m in messages %}<|start_header_id|>{{ m.role }}<|end_header_id|>{{ "
            "m.content }}<|eot_id|>{% endfor %}{% if tools %}{{ tools | tojson }}{% endif %}"),
      tool_format::llama3_json);
  EXPECT_EQ(style("{% for m in messages %}[INST] {{ m.content }}[/INST]{% endfor %}"
                  "{% if tools %}[AVAILABLE_TOOLS]{{ tools | tojson }}[/AVAILABLE_TOOLS]{% endif %}"
                  "{% if false %}[TOOL_CALLS]{% endif %}"),
            tool_format::mistral);
  EXPECT_EQ(
      style("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>{% "
            "endfor %}{% if tools %}<tools>{{ tools | tojson }}</tools> <tool_call>{% endif %}"),
      tool_format::tagged);
  // A template that does not render tools: weft asks for the tagged format.
  EXPECT_EQ(style("{% for m in messages %}<|start_header_id|>{{ m.content }}{% endfor %}"),
            tool_format::tagged);
}

TEST(tool_calls, chat_requests_carry_tools_history_and_the_grammar) {
  const std::string body = std::string(R"({"messages": [
      {"role": "user", "content": "Weather in Paris?"},
      {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
      {"role": "tool", "tool_call_id": "call_1", "content": "18 C"}],
    "tool_choice": "required", "tools": )") +
                           kTools + "}";
  auto r = parse_request(endpoint::chat_completions, body, {});
  ASSERT_TRUE(r.request.has_value()) << r.error.message;
  EXPECT_FALSE(r.request->sampling.grammar.empty());
  EXPECT_TRUE(r.request->tools.active());
  const auto& m = r.request->messages;
  ASSERT_EQ(m.size(), 3u);
  EXPECT_EQ(
      m[1].tool_calls,
      R"([{"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}])");
  EXPECT_EQ(m[2].role, "tool");
  EXPECT_EQ(m[2].tool_call_id, "call_1");
  // A template without tools of its own: weft's tagged format, tools in the system turn.
  auto chatml = gpu::chat_template::from_name("chatml");
  ASSERT_TRUE(chatml.ok());
  auto text = render_chat_prompt(*chatml, *r.request, gpu::generation_prompt::add);
  ASSERT_TRUE(text.ok()) << text.error().message();
  EXPECT_TRUE(text->starts_with("<|im_start|>system\nYou can call functions"));
  EXPECT_NE(text->find("<|im_start|>assistant\n" +
                       tool_call_text("get_weather", R"({"city":"Paris"})") + "<|im_end|>"),
            std::string::npos)
      << *text;
  EXPECT_NE(text->find("<|im_start|>user\n<tool_response>\n18 C\n</tool_response><|im_end|>"),
            std::string::npos);
  // A template that renders tools itself gets them, and the calls and results, as they are.
  auto own = gpu::chat_template::from_jinja(
      "{% for t in tools %}[{{ t.function.name }}]{% endfor %}{% for m in messages %}"
      "<{{ m.role }}>{{ m.content }}{% for c in m.tool_calls or [] %}call {{ c.function.name }} "
      "{{ c.function.arguments }}{% endfor %}{% if m.tool_call_id %} for {{ m.tool_call_id }}"
      "{% endif %}{% endfor %}",
      nullptr);
  ASSERT_TRUE(own.ok()) << own.error().message();
  EXPECT_TRUE(own->renders_tools());
  auto native = render_chat_prompt(*own, *r.request, gpu::generation_prompt::add);
  ASSERT_TRUE(native.ok()) << native.error().message();
  EXPECT_EQ(
      *native,
      R"([get_weather][add]<user>Weather in Paris?<assistant>call get_weather {"city":"Paris"}<tool>18 C for call_1)");
  // A required call and another structured output cannot both hold.
  auto both = parse_request(endpoint::chat_completions,
                            std::string(R"({"messages": [{"role": "user", "content": "x"}],
      "response_format": {"type": "json_object"}, "tool_choice": "required", "tools": )") +
                                kTools + "}",
                            {});
  ASSERT_FALSE(both.request.has_value());
  EXPECT_EQ(both.error.param, "tool_choice");
  auto bad_args = parse_request(endpoint::chat_completions, R"({"messages": [
      {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{oops"}}]}]})",
                                {});
  ASSERT_FALSE(bad_args.request.has_value());
  EXPECT_EQ(bad_args.error.param, "messages[0].tool_calls[0].function.arguments");
}

TEST(tool_calls, responses_render_openai_tool_calls) {
  response_meta meta{"chatcmpl-1", 5, "m"};
  choice_result c;
  c.finish_reason = "tool_calls";
  c.tool_calls.push_back(tool_call{0, "call_1_0_0", "add", R"({"a":1,"b":2})"});
  const auto full =
      nlohmann::json::parse(render_response(endpoint::chat_completions, meta, {c}, {}, false));
  const auto& msg = full["choices"][0]["message"];
  EXPECT_TRUE(msg["content"].is_null());
  EXPECT_EQ(msg["tool_calls"][0]["id"], "call_1_0_0");
  EXPECT_EQ(msg["tool_calls"][0]["type"], "function");
  EXPECT_EQ(msg["tool_calls"][0]["function"]["name"], "add");
  EXPECT_EQ(msg["tool_calls"][0]["function"]["arguments"], R"({"a":1,"b":2})");
  EXPECT_EQ(full["choices"][0]["finish_reason"], "tool_calls");
  const std::string chunk = render_chunk(endpoint::chat_completions, meta, c, false, false, false);
  const auto j = nlohmann::json::parse(chunk.substr(6));
  EXPECT_EQ(j["choices"][0]["delta"]["tool_calls"][0]["index"], 0);
  EXPECT_EQ(j["choices"][0]["delta"]["tool_calls"][0]["function"]["name"], "add");
}

}  // namespace
}  // namespace weft::serve
