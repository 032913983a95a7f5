#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "actors/serve/openai_api.hpp"

namespace weft::serve {
namespace {

using json = nlohmann::json;

openai_request ok_completion(const std::string& body, const api_limits& limits = {}) {
  auto r = parse_request(endpoint::completions, body, limits);
  EXPECT_TRUE(r.request.has_value()) << body << " -> " << r.error.message;
  return r.request.value_or(openai_request{});
}

openai_request ok_chat(const std::string& body, const api_limits& limits = {}) {
  auto r = parse_request(endpoint::chat_completions, body, limits);
  EXPECT_TRUE(r.request.has_value()) << body << " -> " << r.error.message;
  return r.request.value_or(openai_request{});
}

api_error bad(endpoint kind, const std::string& body, const api_limits& limits = {}) {
  auto r = parse_request(kind, body, limits);
  EXPECT_FALSE(r.request.has_value()) << body << " was accepted";
  return r.error;
}

// Expects a 400 naming `param`.
void expect_400(endpoint kind, const std::string& body, const std::string& param) {
  auto e = bad(kind, body);
  EXPECT_EQ(e.http_status, 400) << body;
  EXPECT_EQ(e.type, "invalid_request_error") << body;
  EXPECT_EQ(e.param, param) << body << " -> " << e.message;
  EXPECT_FALSE(e.message.empty()) << body;
}

// Strips "data: " and the blank line of an SSE event and parses its JSON.
json sse_json(const std::string& event) {
  EXPECT_EQ(event.rfind("data: ", 0), 0u) << event;
  EXPECT_GE(event.size(), 8u);
  EXPECT_EQ(event.substr(event.size() - 2), "\n\n") << event;
  const std::string payload = event.substr(6, event.size() - 8);
  EXPECT_EQ(payload.find('\n'), std::string::npos) << "an event must be one line";
  return json::parse(payload);
}

// -- prompt forms -------------------------------------------------------------------------------

TEST(openai_parse, completion_prompt_string) {
  auto r = ok_completion(R"({"model":"m","prompt":"Hello"})");
  EXPECT_EQ(r.kind, endpoint::completions);
  EXPECT_EQ(r.model, "m");
  ASSERT_EQ(r.prompts.size(), 1u);
  EXPECT_EQ(r.prompts[0], "Hello");
  EXPECT_TRUE(r.prompt_token_ids.empty());
  EXPECT_TRUE(r.messages.empty());
}

TEST(openai_parse, completion_prompt_list_of_strings) {
  auto r = ok_completion(R"({"prompt":["a","b\u00e9","c"]})");
  ASSERT_EQ(r.prompts.size(), 3u);
  EXPECT_EQ(r.prompts[1], "b\xc3\xa9");
  EXPECT_EQ(r.prompts[2], "c");
}

TEST(openai_parse, completion_prompt_token_ids) {
  auto r = ok_completion(R"({"prompt":[1,2,3000]})");
  EXPECT_TRUE(r.prompts.empty());
  ASSERT_EQ(r.prompt_token_ids.size(), 1u);
  EXPECT_EQ(r.prompt_token_ids[0], (std::vector<int32_t>{1, 2, 3000}));
}

TEST(openai_parse, completion_prompt_list_of_token_lists) {
  auto r = ok_completion(R"({"prompt":[[1,2],[3],[4,5,6]]})");
  ASSERT_EQ(r.prompt_token_ids.size(), 3u);
  EXPECT_EQ(r.prompt_token_ids[0], (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(r.prompt_token_ids[1], (std::vector<int32_t>{3}));
  EXPECT_EQ(r.prompt_token_ids[2], (std::vector<int32_t>{4, 5, 6}));
}

TEST(openai_parse, completion_prompt_empty_string_is_kept) {
  // OpenAI accepts "" (the model then starts from BOS alone).
  auto r = ok_completion(R"({"prompt":""})");
  ASSERT_EQ(r.prompts.size(), 1u);
  EXPECT_EQ(r.prompts[0], "");
}

TEST(openai_parse, completion_prompt_errors) {
  expect_400(endpoint::completions, R"({"model":"m"})", "prompt");
  expect_400(endpoint::completions, R"({"prompt":null})", "prompt");
  expect_400(endpoint::completions, R"({"prompt":[]})", "prompt");
  expect_400(endpoint::completions, R"({"prompt":42})", "prompt");
  expect_400(endpoint::completions, R"({"prompt":{"text":"x"}})", "prompt");
  expect_400(endpoint::completions, R"({"prompt":["a",1]})", "prompt");
  expect_400(endpoint::completions, R"({"prompt":[1,"a"]})", "prompt");
  expect_400(endpoint::completions, R"({"prompt":[1,-2]})", "prompt");
  expect_400(endpoint::completions, R"({"prompt":[1,2.5]})", "prompt");
  expect_400(endpoint::completions, R"({"prompt":[1,3000000000]})", "prompt");
  expect_400(endpoint::completions, R"({"prompt":[[1],[]]})", "prompt[1]");
  expect_400(endpoint::completions, R"({"prompt":[[1],2]})", "prompt");
  expect_400(endpoint::completions, R"({"prompt":[[1],[2,"x"]]})", "prompt[1]");
  expect_400(endpoint::completions, R"({"prompt":[true]})", "prompt");
}

TEST(openai_parse, the_number_of_prompts_is_capped) {
  api_limits limits;
  limits.max_prompts = 3;
  ok_completion(R"({"prompt":["a","b","c"]})", limits);
  auto e = bad(endpoint::completions, R"({"prompt":["a","b","c","d"]})", limits);
  EXPECT_EQ(e.http_status, 400);
  EXPECT_EQ(e.param, "prompt");
  EXPECT_NE(e.message.find("at most 3"), std::string::npos) << e.message;
  e = bad(endpoint::completions, R"({"prompt":[[1],[2],[3],[4]]})", limits);
  EXPECT_EQ(e.http_status, 400);
  // One prompt of many token ids is one prompt.
  ok_completion(R"({"prompt":[1,2,3,4,5]})", limits);
}

TEST(openai_parse, integral_float_token_ids_are_accepted) {
  auto r = ok_completion(R"({"prompt":[1.0,2]})");
  ASSERT_EQ(r.prompt_token_ids.size(), 1u);
  EXPECT_EQ(r.prompt_token_ids[0], (std::vector<int32_t>{1, 2}));
}

// -- chat messages ------------------------------------------------------------------------------

TEST(openai_parse, chat_messages_string_content) {
  auto r = ok_chat(R"({"model":"m","messages":[{"role":"system","content":"be brief"},
      {"role":"user","content":"hi","name":"bob"},{"role":"assistant","content":"hello"},
      {"role":"user","content":"again"}]})");
  EXPECT_EQ(r.kind, endpoint::chat_completions);
  EXPECT_TRUE(r.prompts.empty());
  ASSERT_EQ(r.messages.size(), 4u);
  EXPECT_EQ(r.messages[0].role, "system");
  EXPECT_EQ(r.messages[0].content, "be brief");
  EXPECT_EQ(r.messages[1].role, "user");
  EXPECT_EQ(r.messages[1].content, "hi");
  EXPECT_EQ(r.messages[2].role, "assistant");
  EXPECT_EQ(r.messages[3].content, "again");
}

TEST(openai_parse, chat_messages_text_parts_are_joined) {
  auto r = ok_chat(R"({"messages":[{"role":"user","content":[{"type":"text","text":"one"},
      {"type":"text","text":"two"}]}]})");
  ASSERT_EQ(r.messages.size(), 1u);
  EXPECT_EQ(r.messages[0].content, "one\ntwo");
}

TEST(openai_parse, chat_developer_role_is_system_and_assistant_content_may_be_null) {
  auto r =
      ok_chat(R"({"messages":[{"role":"developer","content":"rules"},{"role":"user","content":"q"},
      {"role":"assistant","content":null},{"role":"user","content":"q2"}]})");
  ASSERT_EQ(r.messages.size(), 4u);
  EXPECT_EQ(r.messages[0].role, "system");
  EXPECT_EQ(r.messages[2].role, "assistant");
  EXPECT_EQ(r.messages[2].content, "");
}

TEST(openai_parse, chat_message_errors) {
  const auto chat = endpoint::chat_completions;
  expect_400(chat, R"({"model":"m"})", "messages");
  expect_400(chat, R"({"messages":[]})", "messages");
  expect_400(chat, R"({"messages":"hi"})", "messages");
  expect_400(chat, R"({"messages":{"role":"user"}})", "messages");
  expect_400(chat, R"({"messages":["hi"]})", "messages[0]");
  expect_400(chat, R"({"messages":[{"content":"hi"}]})", "messages[0].role");
  expect_400(chat, R"({"messages":[{"role":"user","content":"a"},{"role":7,"content":"b"}]})",
             "messages[1].role");
  expect_400(chat, R"({"messages":[{"role":"wizard","content":"hi"}]})", "messages[0].role");
  expect_400(chat, R"({"messages":[{"role":"function","content":"42","name":"x"}]})",
             "messages[0].role");
  expect_400(chat, R"({"messages":[{"role":"tool","tool_call_id":"x"}]})", "messages[0].content");
  expect_400(chat, R"({"messages":[{"role":"user"}]})", "messages[0].content");
  expect_400(chat, R"({"messages":[{"role":"user","content":null}]})", "messages[0].content");
  expect_400(chat, R"({"messages":[{"role":"user","content":5}]})", "messages[0].content");
  expect_400(chat, R"({"messages":[{"role":"user","content":{"text":"x"}}]})",
             "messages[0].content");
  expect_400(chat, R"({"messages":[{"role":"user","content":["x"]}]})", "messages[0].content[0]");
  expect_400(
      chat,
      R"({"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"u"}}]}]})",
      "messages[0].content[0].type");
  expect_400(chat, R"({"messages":[{"role":"user","content":[{"text":"no type"}]}]})",
             "messages[0].content[0].type");
  expect_400(chat, R"({"messages":[{"role":"user","content":[{"type":"text"}]}]})",
             "messages[0].content[0].text");
  expect_400(chat, R"({"messages":[{"role":"user","content":[{"type":"text","text":1}]}]})",
             "messages[0].content[0].text");
}

TEST(openai_parse, chat_ignores_prompt_and_completions_ignore_messages) {
  // Each endpoint reads only its own input field.
  auto c = ok_chat(R"({"prompt":"x","messages":[{"role":"user","content":"hi"}]})");
  EXPECT_TRUE(c.prompts.empty());
  expect_400(endpoint::completions, R"({"messages":[{"role":"user","content":"hi"}]})", "prompt");
}

// -- body-level errors --------------------------------------------------------------------------

TEST(openai_parse, malformed_json_and_non_object_bodies) {
  for (const char* body :
       {"", "{", "{\"prompt\": \"x\",}", "nope", "{\"prompt\":\"x\"} trailing", "\xff\xfe"}) {
    auto e = bad(endpoint::completions, body);
    EXPECT_EQ(e.http_status, 400) << body;
    EXPECT_EQ(e.type, "invalid_request_error");
    EXPECT_NE(e.message.find("JSON"), std::string::npos) << e.message;
  }
  for (const char* body : {"[]", "\"prompt\"", "42", "null", "true"}) {
    auto e = bad(endpoint::chat_completions, body);
    EXPECT_EQ(e.http_status, 400) << body;
    EXPECT_NE(e.message.find("object"), std::string::npos) << e.message;
    EXPECT_EQ(e.param, "");
  }
}

TEST(openai_parse, body_over_the_limit_is_413) {
  api_limits limits;
  limits.max_body_bytes = 64;
  const std::string body = R"({"prompt":")" + std::string(100, 'a') + R"("})";
  auto e = bad(endpoint::completions, body, limits);
  EXPECT_EQ(e.http_status, 413);
  // Exactly at the limit passes.
  limits.max_body_bytes = body.size();
  EXPECT_TRUE(parse_request(endpoint::completions, body, limits).request.has_value());
}

TEST(openai_parse, deeply_nested_garbage_does_not_crash) {
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  auto e = bad(endpoint::completions, deep);
  EXPECT_EQ(e.http_status, 400);
  const std::string deep_field =
      R"({"prompt":"x","extra":)" + std::string(50000, '[') + std::string(50000, ']') + "}";
  EXPECT_TRUE(parse_request(endpoint::completions, deep_field).request.has_value());
}

// -- sampling fields ----------------------------------------------------------------------------

TEST(openai_parse, defaults_follow_openai) {
  auto r = ok_completion(R"({"prompt":"x"})");
  EXPECT_EQ(r.model, "");
  EXPECT_EQ(r.n, 1);
  EXPECT_FALSE(r.stream);
  EXPECT_FALSE(r.include_usage);
  EXPECT_FALSE(r.echo);
  EXPECT_FALSE(r.has_seed);
  EXPECT_FALSE(r.want_logprobs);
  EXPECT_FALSE(r.ignore_eos);
  EXPECT_EQ(r.sampling.temperature, 1.0f);
  EXPECT_EQ(r.sampling.top_p, 1.0f);
  EXPECT_EQ(r.sampling.top_k, 0);
  EXPECT_EQ(r.sampling.min_p, 0.0f);
  EXPECT_EQ(r.sampling.repetition_penalty, 1.0f);
  EXPECT_EQ(r.sampling.presence_penalty, 0.0f);
  EXPECT_EQ(r.sampling.frequency_penalty, 0.0f);
  EXPECT_EQ(r.sampling.max_tokens, -1);
  EXPECT_TRUE(r.sampling.stop_strings.empty());
  EXPECT_EQ(r.sampling.n_logprobs, 0);
}

TEST(openai_parse, explicit_nulls_mean_not_given) {
  auto r =
      ok_completion(R"({"prompt":"x","model":null,"temperature":null,"max_tokens":null,"stop":null,
      "seed":null,"n":null,"stream":null,"logprobs":null,"top_p":null,"user":null,"stream_options":null})");
  EXPECT_EQ(r.sampling.temperature, 1.0f);
  EXPECT_EQ(r.sampling.max_tokens, -1);
  EXPECT_FALSE(r.has_seed);
  EXPECT_FALSE(r.want_logprobs);
}

TEST(openai_parse, every_sampling_field_maps) {
  auto r = ok_completion(
      R"({"model":"tiny","prompt":"x","n":3,"stream":true,"stream_options":{"include_usage":true},
      "echo":true,"temperature":0.7,"top_p":0.9,"top_k":40,"min_p":0.05,"repetition_penalty":1.1,
      "presence_penalty":-0.5,"frequency_penalty":1.5,"max_tokens":32,"seed":1234,"stop":["\n\n","END"],
      "logprobs":3,"ignore_eos":true,"user":"u-1","unknown_field":{"anything":[1,2]}})");
  EXPECT_EQ(r.model, "tiny");
  EXPECT_EQ(r.n, 3);
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  EXPECT_TRUE(r.echo);
  EXPECT_FLOAT_EQ(r.sampling.temperature, 0.7f);
  EXPECT_FLOAT_EQ(r.sampling.top_p, 0.9f);
  EXPECT_EQ(r.sampling.top_k, 40);
  EXPECT_FLOAT_EQ(r.sampling.min_p, 0.05f);
  EXPECT_FLOAT_EQ(r.sampling.repetition_penalty, 1.1f);
  EXPECT_FLOAT_EQ(r.sampling.presence_penalty, -0.5f);
  EXPECT_FLOAT_EQ(r.sampling.frequency_penalty, 1.5f);
  EXPECT_EQ(r.sampling.max_tokens, 32);
  EXPECT_TRUE(r.has_seed);
  EXPECT_EQ(r.sampling.seed, 1234u);
  EXPECT_EQ(r.sampling.stop_strings, (std::vector<std::string>{"\n\n", "END"}));
  EXPECT_TRUE(r.want_logprobs);
  EXPECT_EQ(r.top_logprobs, 3);
  EXPECT_EQ(r.sampling.n_logprobs, 3);
  EXPECT_TRUE(r.ignore_eos);
  EXPECT_EQ(r.user, "u-1");
}

TEST(openai_parse, boundaries_are_inclusive_where_openai_says_so) {
  auto lo = ok_completion(R"({"prompt":"x","temperature":0,"top_p":1e-9,"n":1,"max_tokens":1,
      "presence_penalty":-2,"frequency_penalty":-2,"top_k":-1,"min_p":0,"logprobs":0})");
  EXPECT_EQ(lo.sampling.temperature, 0.0f);
  EXPECT_EQ(lo.sampling.top_k, 0);  // -1 means off
  EXPECT_EQ(lo.sampling.max_tokens, 1);
  EXPECT_TRUE(lo.want_logprobs);
  EXPECT_EQ(lo.top_logprobs, 0);
  EXPECT_EQ(lo.sampling.n_logprobs, 0);
  api_limits limits;
  auto hi = ok_completion(R"({"prompt":"x","temperature":2,"top_p":1,"n":16,"max_tokens":1048576,
      "presence_penalty":2,"frequency_penalty":2,"top_k":0,"min_p":1,"logprobs":20})",
                          limits);
  EXPECT_EQ(hi.sampling.temperature, 2.0f);
  EXPECT_EQ(hi.n, 16);
  EXPECT_EQ(hi.sampling.max_tokens, 1 << 20);
  EXPECT_EQ(hi.top_logprobs, 20);
}

TEST(openai_parse, priority_needs_the_priority_policy) {
  // Absent or 0: every policy accepts it (0 is everyone's priority).
  EXPECT_EQ(ok_completion(R"({"prompt":"x"})").sampling.priority, 0);
  EXPECT_EQ(ok_completion(R"({"prompt":"x","priority":0})").sampling.priority, 0);
  // Nonzero on a server that does not rank by it: refused, not ignored.
  expect_400(endpoint::completions, R"({"prompt":"x","priority":-5})", "priority");
  api_limits limits;
  limits.priority_scheduling = true;
  EXPECT_EQ(ok_completion(R"({"prompt":"x","priority":-5})", limits).sampling.priority, -5);
  EXPECT_EQ(ok_completion(R"({"prompt":"x","priority":2147483647})", limits).sampling.priority,
            2147483647);
  auto chat =
      parse_request(endpoint::chat_completions,
                    R"({"messages":[{"role":"user","content":"hi"}],"priority":7})", limits);
  ASSERT_TRUE(chat.request.has_value()) << chat.error.message;
  EXPECT_EQ(chat.request->sampling.priority, 7);
  for (const char* body :
       {R"({"prompt":"x","priority":1.5})", R"({"prompt":"x","priority":"high"})",
        R"({"prompt":"x","priority":2147483648})"}) {
    auto r = parse_request(endpoint::completions, body, limits);
    ASSERT_FALSE(r.request.has_value()) << body;
    EXPECT_EQ(r.error.http_status, 400);
    EXPECT_EQ(r.error.param, "priority");
  }
}

TEST(openai_parse, wrong_types_name_the_field) {
  const auto c = endpoint::completions;
  expect_400(c, R"({"prompt":"x","max_tokens":"ten"})", "max_tokens");
  expect_400(c, R"({"prompt":"x","max_tokens":10.5})", "max_tokens");
  expect_400(c, R"({"prompt":"x","max_tokens":true})", "max_tokens");
  expect_400(c, R"({"prompt":"x","temperature":"hot"})", "temperature");
  expect_400(c, R"({"prompt":"x","temperature":[1]})", "temperature");
  expect_400(c, R"({"prompt":"x","top_p":"all"})", "top_p");
  expect_400(c, R"({"prompt":"x","n":"2"})", "n");
  expect_400(c, R"({"prompt":"x","n":1.5})", "n");
  expect_400(c, R"({"prompt":"x","stream":"yes"})", "stream");
  expect_400(c, R"({"prompt":"x","stream":1})", "stream");
  expect_400(c, R"({"prompt":"x","echo":"true"})", "echo");
  expect_400(c, R"({"prompt":"x","model":42})", "model");
  expect_400(c, R"({"prompt":"x","seed":"42"})", "seed");
  expect_400(c, R"({"prompt":"x","seed":4.2})", "seed");
  expect_400(c, R"({"prompt":"x","stop":42})", "stop");
  expect_400(c, R"({"prompt":"x","stop":["a",1]})", "stop");
  expect_400(c, R"({"prompt":"x","stop":{"s":"a"}})", "stop");
  expect_400(c, R"({"prompt":"x","logprobs":true})", "logprobs");
  expect_400(c, R"({"prompt":"x","top_k":"many"})", "top_k");
  expect_400(c, R"({"prompt":"x","min_p":"small"})", "min_p");
  expect_400(c, R"({"prompt":"x","presence_penalty":"p"})", "presence_penalty");
  expect_400(c, R"({"prompt":"x","frequency_penalty":null,"repetition_penalty":"r"})",
             "repetition_penalty");
  expect_400(c, R"({"prompt":"x","ignore_eos":0})", "ignore_eos");
  expect_400(c, R"({"prompt":"x","user":5})", "user");
  expect_400(c, R"({"prompt":"x","stream":true,"stream_options":true})", "stream_options");
  expect_400(c, R"({"prompt":"x","stream":true,"stream_options":{"include_usage":"yes"}})",
             "stream_options.include_usage");
  expect_400(endpoint::chat_completions,
             R"({"messages":[{"role":"user","content":"x"}],"logprobs":3})", "logprobs");
  expect_400(endpoint::chat_completions,
             R"({"messages":[{"role":"user","content":"x"}],"max_completion_tokens":"5"})",
             "max_completion_tokens");
}

TEST(openai_parse, out_of_range_values_name_the_field) {
  const auto c = endpoint::completions;
  expect_400(c, R"({"prompt":"x","temperature":-0.1})", "temperature");
  expect_400(c, R"({"prompt":"x","temperature":2.01})", "temperature");
  // A number too large for a double is a JSON error (400) already.
  EXPECT_EQ(bad(c, R"({"prompt":"x","temperature":1e400})").http_status, 400);
  expect_400(c, R"({"prompt":"x","top_p":0})", "top_p");
  expect_400(c, R"({"prompt":"x","top_p":1.5})", "top_p");
  expect_400(c, R"({"prompt":"x","top_p":-1})", "top_p");
  expect_400(c, R"({"prompt":"x","n":0})", "n");
  expect_400(c, R"({"prompt":"x","n":17})", "n");
  expect_400(c, R"({"prompt":"x","n":-3})", "n");
  expect_400(c, R"({"prompt":"x","max_tokens":0})", "max_tokens");
  expect_400(c, R"({"prompt":"x","max_tokens":-5})", "max_tokens");
  expect_400(c, R"({"prompt":"x","max_tokens":1048577})", "max_tokens");
  expect_400(c, R"({"prompt":"x","max_tokens":99999999999999999999})", "max_tokens");
  expect_400(c, R"({"prompt":"x","presence_penalty":2.5})", "presence_penalty");
  expect_400(c, R"({"prompt":"x","presence_penalty":-2.5})", "presence_penalty");
  expect_400(c, R"({"prompt":"x","frequency_penalty":3})", "frequency_penalty");
  expect_400(c, R"({"prompt":"x","frequency_penalty":-3})", "frequency_penalty");
  expect_400(c, R"({"prompt":"x","top_k":-2})", "top_k");
  expect_400(c, R"({"prompt":"x","top_k":3000000000})", "top_k");
  expect_400(c, R"({"prompt":"x","min_p":-0.1})", "min_p");
  expect_400(c, R"({"prompt":"x","min_p":1.1})", "min_p");
  expect_400(c, R"({"prompt":"x","repetition_penalty":0})", "repetition_penalty");
  expect_400(c, R"({"prompt":"x","repetition_penalty":-1})", "repetition_penalty");
  expect_400(c, R"({"prompt":"x","logprobs":-1})", "logprobs");
  expect_400(c, R"({"prompt":"x","logprobs":21})", "logprobs");
  expect_400(c, R"({"prompt":"x","stop":["a","b","c","d","e"]})", "stop");
  const auto chat = endpoint::chat_completions;
  const std::string msgs = R"("messages":[{"role":"user","content":"x"}])";
  expect_400(chat, "{" + msgs + R"(,"logprobs":true,"top_logprobs":21})", "top_logprobs");
  expect_400(chat, "{" + msgs + R"(,"logprobs":true,"top_logprobs":-1})", "top_logprobs");
  expect_400(chat, "{" + msgs + R"(,"top_logprobs":2})", "top_logprobs");
  expect_400(chat, "{" + msgs + R"(,"max_completion_tokens":0})", "max_completion_tokens");
}

TEST(openai_parse, limits_are_configurable) {
  api_limits limits;
  limits.max_n = 2;
  limits.max_top_logprobs = 5;
  limits.max_stop_strings = 1;
  limits.max_tokens_limit = 100;
  EXPECT_EQ(bad(endpoint::completions, R"({"prompt":"x","n":3})", limits).param, "n");
  EXPECT_EQ(bad(endpoint::completions, R"({"prompt":"x","logprobs":6})", limits).param, "logprobs");
  EXPECT_EQ(bad(endpoint::completions, R"({"prompt":"x","stop":["a","b"]})", limits).param, "stop");
  EXPECT_EQ(bad(endpoint::completions, R"({"prompt":"x","max_tokens":101})", limits).param,
            "max_tokens");
  auto r =
      ok_completion(R"({"prompt":"x","n":2,"logprobs":5,"stop":["a"],"max_tokens":100})", limits);
  EXPECT_EQ(r.n, 2);
  EXPECT_EQ(r.sampling.max_tokens, 100);
}

TEST(openai_parse, stop_forms) {
  EXPECT_EQ(ok_completion(R"({"prompt":"x","stop":"###"})").sampling.stop_strings,
            (std::vector<std::string>{"###"}));
  EXPECT_TRUE(ok_completion(R"({"prompt":"x","stop":""})").sampling.stop_strings.empty());
  EXPECT_TRUE(ok_completion(R"({"prompt":"x","stop":[]})").sampling.stop_strings.empty());
  EXPECT_EQ(ok_completion(R"({"prompt":"x","stop":["","a",""]})").sampling.stop_strings,
            (std::vector<std::string>{"a"}));
}

TEST(openai_parse, seeds_of_every_sign) {
  auto neg = ok_completion(R"({"prompt":"x","seed":-1})");
  EXPECT_TRUE(neg.has_seed);
  EXPECT_EQ(neg.sampling.seed, UINT64_MAX);
  auto zero = ok_completion(R"({"prompt":"x","seed":0})");
  EXPECT_TRUE(zero.has_seed);
  EXPECT_EQ(zero.sampling.seed, 0u);
  auto big = ok_completion(R"({"prompt":"x","seed":18446744073709551615})");
  EXPECT_EQ(big.sampling.seed, UINT64_MAX);
  auto min = ok_completion(R"({"prompt":"x","seed":-9223372036854775808})");
  EXPECT_EQ(min.sampling.seed, 1ull << 63);
}

TEST(openai_parse, chat_max_tokens_and_max_completion_tokens) {
  const std::string msgs = R"("messages":[{"role":"user","content":"x"}])";
  EXPECT_EQ(ok_chat("{" + msgs + R"(,"max_tokens":7})").sampling.max_tokens, 7);
  EXPECT_EQ(ok_chat("{" + msgs + R"(,"max_completion_tokens":9})").sampling.max_tokens, 9);
  EXPECT_EQ(
      ok_chat("{" + msgs + R"(,"max_tokens":7,"max_completion_tokens":9})").sampling.max_tokens, 9);
  EXPECT_EQ(ok_chat("{" + msgs + "}").sampling.max_tokens, -1);
  // Completions do not know max_completion_tokens (an unknown field, ignored).
  EXPECT_EQ(ok_completion(R"({"prompt":"x","max_completion_tokens":9})").sampling.max_tokens, -1);
}

TEST(openai_parse, chat_logprobs) {
  const std::string msgs = R"("messages":[{"role":"user","content":"x"}])";
  auto off = ok_chat("{" + msgs + R"(,"logprobs":false,"top_logprobs":0})");
  EXPECT_FALSE(off.want_logprobs);
  EXPECT_EQ(off.sampling.n_logprobs, 0);
  auto only_chosen = ok_chat("{" + msgs + R"(,"logprobs":true})");
  EXPECT_TRUE(only_chosen.want_logprobs);
  EXPECT_EQ(only_chosen.top_logprobs, 0);
  auto top = ok_chat("{" + msgs + R"(,"logprobs":true,"top_logprobs":5})");
  EXPECT_TRUE(top.want_logprobs);
  EXPECT_EQ(top.top_logprobs, 5);
  EXPECT_EQ(top.sampling.n_logprobs, 5);
  // Chat has no echo.
  EXPECT_FALSE(ok_chat("{" + msgs + R"(,"echo":true})").echo);
}

TEST(openai_parse, stream_options_need_stream) {
  expect_400(endpoint::completions, R"({"prompt":"x","stream_options":{"include_usage":true}})",
             "stream_options");
  expect_400(endpoint::completions,
             R"({"prompt":"x","stream":false,"stream_options":{"include_usage":true}})",
             "stream_options");
  auto r = ok_completion(R"({"prompt":"x","stream":true,"stream_options":{}})");
  EXPECT_TRUE(r.stream);
  EXPECT_FALSE(r.include_usage);
}

TEST(openai_parse, logit_bias_maps_token_ids_to_biases) {
  const auto c = endpoint::completions;
  auto r = ok_completion(R"({"prompt":"x","logit_bias":{"50256":-100,"7":2.5,"0":100}})");
  using bias = std::pair<int32_t, float>;
  EXPECT_EQ(r.sampling.logit_bias, (std::vector<bias>{{0, 100.0f}, {7, 2.5f}, {50256, -100.0f}}));
  EXPECT_TRUE(ok_completion(R"({"prompt":"x","logit_bias":{}})").sampling.logit_bias.empty());
  expect_400(c, R"({"prompt":"x","logit_bias":[1]})", "logit_bias");
  expect_400(c, R"({"prompt":"x","logit_bias":{"a":1}})", "logit_bias");
  expect_400(c, R"({"prompt":"x","logit_bias":{"-3":1}})", "logit_bias");
  expect_400(c, R"({"prompt":"x","logit_bias":{"1.5":1}})", "logit_bias");
  expect_400(c, R"({"prompt":"x","logit_bias":{"99999999999":1}})", "logit_bias");
  expect_400(c, R"({"prompt":"x","logit_bias":{"5":100.5}})", "logit_bias");
  expect_400(c, R"({"prompt":"x","logit_bias":{"5":"-100"}})", "logit_bias");
  expect_400(endpoint::chat_completions,
             R"({"messages":[{"role":"user","content":"x"}],"logit_bias":{"5":true}})",
             "logit_bias");
  std::string many = R"({"prompt":"x","logit_bias":{)";
  for (int i = 0; i <= static_cast<int>(gpu::kMaxLogitBias); ++i)
    many += (i ? "," : "") + std::string{"\""} + std::to_string(i) + "\":1";
  expect_400(c, many + "}}", "logit_bias");
}

TEST(openai_parse, unsupported_features_are_refused_not_ignored) {
  const auto c = endpoint::completions;
  const auto chat = endpoint::chat_completions;
  const std::string msgs = R"("messages":[{"role":"user","content":"x"}])";
  expect_400(c, R"({"prompt":"x","suffix":"tail"})", "suffix");
  expect_400(c, R"({"prompt":"x","best_of":3})", "best_of");
  expect_400(chat,
             "{" + msgs +
                 R"(,"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":"maybe"})",
             "tool_choice");
  expect_400(chat, "{" + msgs + R"(,"functions":[{"name":"f"}]})", "functions");
  expect_400(chat, "{" + msgs + R"(,"response_format":{"type":"xml"}})", "response_format");
  expect_400(chat, "{" + msgs + R"(,"response_format":"json"})", "response_format");
  // Their neutral values are fine.
  ok_completion(R"({"prompt":"x","logit_bias":{},"suffix":"","best_of":2,"n":2})");
  ok_chat("{" + msgs +
          R"(,"tools":[],"logit_bias":{},"response_format":{"type":"text"},"tool_choice":"none"})");
}

TEST(openai_parse, structured_outputs_compile_to_a_grammar_or_a_400) {
  const auto c = endpoint::completions;
  const auto chat = endpoint::chat_completions;
  const std::string msgs = R"("messages":[{"role":"user","content":"x"}])";
  auto grammar_of = [](endpoint k, const std::string& body) {
    auto r = parse_request(k, body);
    EXPECT_TRUE(r.request.has_value()) << body << ": " << r.error.message;
    return r.request ? r.request->sampling.grammar : std::string{};
  };
  EXPECT_NE(grammar_of(chat, "{" + msgs + R"(,"response_format":{"type":"json_object"}})")
                .find("root ::= object"),
            std::string::npos);
  // The schema's properties keep their declared order (z before a).
  const auto g = grammar_of(chat, "{" + msgs +
                                      R"(,"response_format":{"type":"json_schema","json_schema":
      {"name":"s","schema":{"type":"object","properties":{"z":{"type":"integer"},
       "a":{"type":"boolean"}},"required":["z","a"]}}}})");
  ASSERT_NE(g.find(R"(\"z\")"), std::string::npos) << g;
  EXPECT_LT(g.find(R"(\"z\")"), g.find(R"(\"a\")")) << g;
  EXPECT_FALSE(grammar_of(c, R"({"prompt":"x","grammar":"root ::= \"y\""})").empty());
  EXPECT_FALSE(grammar_of(c, R"({"prompt":"x","json_schema":{"type":"integer"}})").empty());
  EXPECT_FALSE(grammar_of(c, R"({"prompt":"x","guided_json":{"type":"string"}})").empty());
  EXPECT_TRUE(grammar_of(chat, "{" + msgs + R"(,"response_format":{"type":"text"}})").empty());
  expect_400(c, R"({"prompt":"x","grammar":"root ::= nope"})", "grammar");
  expect_400(c, R"({"prompt":"x","grammar":7})", "grammar");
  expect_400(c, R"({"prompt":"x","json_schema":{"type":"string","pattern":"a"}})", "json_schema");
  expect_400(c, R"({"prompt":"x","grammar":"root ::= \"y\"","guided_json":{}})", "grammar");
  expect_400(chat, "{" + msgs + R"(,"response_format":{"type":"json_schema"}})", "response_format");
  expect_400(chat, "{" + msgs + R"(,"response_format":{"type":"json_object"},"ignore_eos":true})",
             "ignore_eos");
}

TEST(openai_parse, error_message_quotes_the_value_briefly) {
  auto e = bad(endpoint::completions, R"({"prompt":"x","temperature":"hot"})");
  EXPECT_NE(e.message.find("temperature"), std::string::npos);
  EXPECT_NE(e.message.find("\"hot\""), std::string::npos) << e.message;
  const std::string huge = R"({"prompt":"x","max_tokens":")" + std::string(10000, 'z') + R"("})";
  EXPECT_LT(bad(endpoint::completions, huge).message.size(), 200u);
}

// -- rendering: non-streaming ------------------------------------------------------------------

response_meta meta(const char* id) {
  response_meta m;
  m.id = id;
  m.created = 1700000000;
  m.model = "tiny";
  return m;
}

logprob_entry lp(std::string token, float logprob, std::vector<logprob_entry::alt> top = {}) {
  logprob_entry e;
  e.token = token;
  e.logprob = logprob;
  e.bytes.assign(token.begin(), token.end());
  e.top = std::move(top);
  return e;
}

logprob_entry::alt alt(std::string token, float logprob) {
  return {token, logprob, std::vector<uint8_t>(token.begin(), token.end())};
}

TEST(openai_render, completion_response_shape) {
  choice_result a;
  a.index = 0;
  a.text = " world";
  a.finish_reason = "length";
  choice_result b;
  b.index = 1;
  b.text = "!";
  b.finish_reason = "stop";
  usage_info u{5, 7, 2};
  const json j =
      json::parse(render_response(endpoint::completions, meta("cmpl-1"), {a, b}, u, false));
  EXPECT_EQ(j["id"], "cmpl-1");
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["created"], 1700000000);
  EXPECT_EQ(j["model"], "tiny");
  EXPECT_EQ(j["system_fingerprint"], "weft");
  ASSERT_EQ(j["choices"].size(), 2u);
  EXPECT_EQ(j["choices"][0]["index"], 0);
  EXPECT_EQ(j["choices"][0]["text"], " world");
  EXPECT_TRUE(j["choices"][0]["logprobs"].is_null());
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(j["choices"][1]["index"], 1);
  EXPECT_EQ(j["choices"][1]["finish_reason"], "stop");
  EXPECT_EQ(j["usage"]["prompt_tokens"], 5);
  EXPECT_EQ(j["usage"]["completion_tokens"], 7);
  EXPECT_EQ(j["usage"]["total_tokens"], 12);
  EXPECT_EQ(j["usage"]["prompt_tokens_details"]["cached_tokens"], 2);
  EXPECT_FALSE(j["choices"][0].contains("message"));
}

TEST(openai_render, chat_response_shape) {
  choice_result a;
  a.text = "Hi there";
  a.finish_reason = "stop";
  const json j = json::parse(
      render_response(endpoint::chat_completions, meta("chatcmpl-1"), {a}, {3, 2, 0}, false));
  EXPECT_EQ(j["object"], "chat.completion");
  ASSERT_EQ(j["choices"].size(), 1u);
  const json& c = j["choices"][0];
  EXPECT_EQ(c["index"], 0);
  EXPECT_EQ(c["message"]["role"], "assistant");
  EXPECT_EQ(c["message"]["content"], "Hi there");
  EXPECT_TRUE(c["logprobs"].is_null());
  EXPECT_EQ(c["finish_reason"], "stop");
  EXPECT_FALSE(c.contains("text"));
  EXPECT_EQ(j["usage"]["total_tokens"], 5);
}

TEST(openai_render, unfinished_choice_has_null_finish_reason) {
  choice_result a;
  a.text = "x";
  const json j = json::parse(render_response(endpoint::completions, meta("c"), {a}, {}, false));
  EXPECT_TRUE(j["choices"][0]["finish_reason"].is_null());
}

TEST(openai_render, completion_logprobs_shape) {
  choice_result a;
  a.text = "Hello world";
  a.finish_reason = "length";
  a.logprobs = {lp("Hello", -0.5f, {alt("Hello", -0.5f), alt("Hi", -1.25f)}),
                lp(" world", -0.25f, {alt(" world", -0.25f), alt(" there", -2.0f)})};
  const json j = json::parse(render_response(endpoint::completions, meta("c"), {a}, {}, true));
  const json& l = j["choices"][0]["logprobs"];
  EXPECT_EQ(l["tokens"], json::array({"Hello", " world"}));
  EXPECT_EQ(l["token_logprobs"], json::array({-0.5, -0.25}));
  ASSERT_EQ(l["top_logprobs"].size(), 2u);
  EXPECT_EQ(l["top_logprobs"][0], (json{{"Hello", -0.5}, {"Hi", -1.25}}));
  EXPECT_EQ(l["top_logprobs"][1], (json{{" world", -0.25}, {" there", -2.0}}));
  EXPECT_EQ(l["text_offset"], json::array({0, 5}));
}

TEST(openai_render, completion_text_offset_follows_an_echoed_prompt) {
  choice_result a;
  a.text = "Say: Hello world";  // echo: the prompt "Say: " comes first
  a.logprobs = {lp("Hello", -0.5f), lp(" world", -0.25f)};
  const json j = json::parse(render_response(endpoint::completions, meta("c"), {a}, {}, true));
  EXPECT_EQ(j["choices"][0]["logprobs"]["text_offset"], json::array({5, 10}));
  EXPECT_EQ(j["choices"][0]["logprobs"]["top_logprobs"][0], json::object());
}

TEST(openai_render, logprobs_are_short_and_finite) {
  choice_result a;
  a.text = "ab";
  a.logprobs = {lp("a", -0.1f), lp("b", -std::numeric_limits<float>::infinity())};
  const std::string body = render_response(endpoint::completions, meta("c"), {a}, {}, true);
  EXPECT_NE(body.find("-0.1,"), std::string::npos) << body;  // not -0.10000000149011612
  const json j = json::parse(body);
  EXPECT_EQ(j["choices"][0]["logprobs"]["token_logprobs"][1], -9999.0);
}

TEST(openai_render, chat_logprobs_shape) {
  choice_result a;
  a.text = "Hi!";
  a.finish_reason = "stop";
  a.logprobs = {lp("Hi", -0.5f, {alt("Hi", -0.5f), alt("Hey", -1.5f)}),
                lp("!", -0.75f, {alt("!", -0.75f)})};
  const json j =
      json::parse(render_response(endpoint::chat_completions, meta("cc"), {a}, {}, true));
  const json& content = j["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), 2u);
  EXPECT_EQ(content[0]["token"], "Hi");
  EXPECT_EQ(content[0]["logprob"], -0.5);
  EXPECT_EQ(content[0]["bytes"], json::array({72, 105}));
  ASSERT_EQ(content[0]["top_logprobs"].size(), 2u);
  EXPECT_EQ(content[0]["top_logprobs"][1]["token"], "Hey");
  EXPECT_EQ(content[0]["top_logprobs"][1]["logprob"], -1.5);
  EXPECT_EQ(content[0]["top_logprobs"][1]["bytes"], json::array({72, 101, 121}));
  EXPECT_EQ(content[1]["token"], "!");
}

TEST(openai_render, partial_utf8_tokens_do_not_break_json) {
  // A token that is the first byte of a two-byte character.
  choice_result a;
  a.text = "caf\xc3";
  a.logprobs = {lp("caf", -0.1f), lp("\xc3", -0.2f, {alt("\xc3", -0.2f)})};
  for (auto kind : {endpoint::completions, endpoint::chat_completions}) {
    const std::string body = render_response(kind, meta("c"), {a}, {}, true);
    const json j = json::parse(body);  // valid UTF-8: the stray byte is replaced
    EXPECT_FALSE(j["choices"].empty());
    if (kind == endpoint::chat_completions) {
      // The raw bytes stay exact.
      EXPECT_EQ(j["choices"][0]["logprobs"]["content"][1]["bytes"], json::array({0xc3}));
    }
  }
  EXPECT_NO_THROW(json::parse(
      sse_json(render_chunk(endpoint::chat_completions, meta("c"), a, true, true, false)).dump()));
}

// -- rendering: streaming ----------------------------------------------------------------------

TEST(openai_render, chat_chunks) {
  choice_result d;
  d.index = 2;
  d.text = "Hel";
  const json first =
      sse_json(render_chunk(endpoint::chat_completions, meta("cc-9"), d, true, false, false));
  EXPECT_EQ(first["id"], "cc-9");
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["created"], 1700000000);
  EXPECT_EQ(first["model"], "tiny");
  ASSERT_EQ(first["choices"].size(), 1u);
  EXPECT_EQ(first["choices"][0]["index"], 2);
  EXPECT_EQ(first["choices"][0]["delta"], (json{{"role", "assistant"}, {"content", "Hel"}}));
  EXPECT_TRUE(first["choices"][0]["logprobs"].is_null());
  EXPECT_TRUE(first["choices"][0]["finish_reason"].is_null());
  EXPECT_FALSE(first.contains("usage"));

  d.text = "lo";
  const json next =
      sse_json(render_chunk(endpoint::chat_completions, meta("cc-9"), d, false, false, true));
  EXPECT_EQ(next["choices"][0]["delta"], (json{{"content", "lo"}}));
  EXPECT_TRUE(next.contains("usage"));
  EXPECT_TRUE(next["usage"].is_null());

  d.text.clear();
  d.finish_reason = "stop";
  const json last =
      sse_json(render_chunk(endpoint::chat_completions, meta("cc-9"), d, false, false, false));
  EXPECT_EQ(last["choices"][0]["delta"], json::object());
  EXPECT_EQ(last["choices"][0]["finish_reason"], "stop");

  // A first chunk with no text still names the role and has a (empty) content.
  const json empty_first = sse_json(
      render_chunk(endpoint::chat_completions, meta("cc-9"), choice_result{}, true, false, false));
  EXPECT_EQ(empty_first["choices"][0]["delta"], (json{{"role", "assistant"}, {"content", ""}}));
}

TEST(openai_render, chat_chunk_logprobs) {
  choice_result d;
  d.text = "Hi";
  d.logprobs = {lp("Hi", -0.5f, {alt("Hi", -0.5f)})};
  const json c =
      sse_json(render_chunk(endpoint::chat_completions, meta("cc"), d, true, true, false));
  const json& content = c["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), 1u);
  EXPECT_EQ(content[0]["token"], "Hi");
  EXPECT_EQ(content[0]["top_logprobs"][0]["token"], "Hi");
}

TEST(openai_render, completion_chunks) {
  choice_result d;
  d.index = 1;
  d.text = " wor";
  d.logprobs = {lp(" wor", -1.0f, {alt(" wor", -1.0f), alt(" wo", -3.0f)})};
  const json c = sse_json(render_chunk(endpoint::completions, meta("cmpl-3"), d, true, true, true));
  EXPECT_EQ(c["object"], "text_completion");
  EXPECT_EQ(c["choices"][0]["index"], 1);
  EXPECT_EQ(c["choices"][0]["text"], " wor");
  EXPECT_FALSE(c["choices"][0].contains("delta"));
  EXPECT_EQ(c["choices"][0]["logprobs"]["tokens"], json::array({" wor"}));
  EXPECT_EQ(c["choices"][0]["logprobs"]["top_logprobs"][0], (json{{" wor", -1.0}, {" wo", -3.0}}));
  EXPECT_EQ(c["choices"][0]["logprobs"]["text_offset"], json::array({0}));
  EXPECT_TRUE(c["choices"][0]["finish_reason"].is_null());
  EXPECT_TRUE(c["usage"].is_null());
  d.finish_reason = "length";
  d.text.clear();
  d.logprobs.clear();
  const json last =
      sse_json(render_chunk(endpoint::completions, meta("cmpl-3"), d, false, false, false));
  EXPECT_EQ(last["choices"][0]["text"], "");
  EXPECT_EQ(last["choices"][0]["finish_reason"], "length");
}

TEST(openai_render, usage_chunk_and_done) {
  for (auto kind : {endpoint::completions, endpoint::chat_completions}) {
    const json u = sse_json(render_usage_chunk(kind, meta("x"), {10, 4, 8}));
    EXPECT_EQ(u["object"],
              kind == endpoint::completions ? "text_completion" : "chat.completion.chunk");
    EXPECT_EQ(u["choices"], json::array());
    EXPECT_EQ(u["usage"]["prompt_tokens"], 10);
    EXPECT_EQ(u["usage"]["completion_tokens"], 4);
    EXPECT_EQ(u["usage"]["total_tokens"], 14);
    EXPECT_EQ(u["usage"]["prompt_tokens_details"]["cached_tokens"], 8);
  }
  EXPECT_EQ(render_done(), "data: [DONE]\n\n");
}

// -- errors and models --------------------------------------------------------------------------

TEST(openai_render, error_bodies) {
  api_error e{404, "invalid_request_error", "The model 'x' does not exist", "model",
              "model_not_found"};
  const json j = json::parse(render_error(e));
  EXPECT_EQ(j, (json{{"error",
                      {{"message", "The model 'x' does not exist"},
                       {"type", "invalid_request_error"},
                       {"param", "model"},
                       {"code", "model_not_found"}}}}));
  api_error plain{500, "server_error", "boom", "", ""};
  const json p = json::parse(render_error(plain));
  EXPECT_TRUE(p["error"]["param"].is_null());
  EXPECT_TRUE(p["error"]["code"].is_null());
  EXPECT_EQ(sse_json(render_error_event(plain)), p);
  // Messages with quotes and newlines stay one SSE line.
  api_error tricky{400, "invalid_request_error", "bad \"x\"\nline2", "", ""};
  EXPECT_EQ(sse_json(render_error_event(tricky))["error"]["message"], "bad \"x\"\nline2");
}

TEST(openai_render, a_parse_error_renders_as_openai_error) {
  auto e = bad(endpoint::completions, R"({"prompt":"x","temperature":"hot"})");
  const json j = json::parse(render_error(e));
  EXPECT_EQ(j["error"]["param"], "temperature");
  EXPECT_EQ(j["error"]["type"], "invalid_request_error");
}

TEST(openai_render, models_list) {
  const json j = json::parse(render_models({"tiny", "other"}, 1700000001));
  EXPECT_EQ(j["object"], "list");
  ASSERT_EQ(j["data"].size(), 2u);
  EXPECT_EQ(
      j["data"][0],
      (json{{"id", "tiny"}, {"object", "model"}, {"created", 1700000001}, {"owned_by", "weft"}}));
  EXPECT_EQ(j["data"][1]["id"], "other");
  EXPECT_EQ(json::parse(render_models({}, 0))["data"], json::array());
}

// -- robustness ---------------------------------------------------------------------------------

TEST(openai_parse, never_throws_on_mutated_bodies) {
  const std::string seeds[] = {
      R"({"model":"m","prompt":["a","b"],"max_tokens":5,"stop":["x"],"logprobs":2,"seed":-3})",
      R"({"messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}],"logprobs":true,"top_logprobs":2})",
  };
  uint64_t state = 0x9e3779b97f4a7c15ull;
  auto next = [&] {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return state;
  };
  const char alphabet[] = "{}[]\",:0123456789-.eE truefalsnul\\u";
  size_t accepted = 0;
  for (int i = 0; i < 20000; ++i) {
    std::string body = seeds[i % 2];
    const int edits = 1 + static_cast<int>(next() % 4);
    for (int k = 0; k < edits && !body.empty(); ++k) {
      const size_t pos = next() % body.size();
      switch (next() % 3) {
        case 0:
          body[pos] = alphabet[next() % (sizeof alphabet - 1)];
          break;
        case 1:
          body.erase(pos, 1 + next() % 3);
          break;
        default:
          body.insert(pos, 1, alphabet[next() % (sizeof alphabet - 1)]);
          break;
      }
    }
    const auto kind = i % 2 == 0 ? endpoint::completions : endpoint::chat_completions;
    parse_result r;
    ASSERT_NO_THROW(r = parse_request(kind, body)) << body;
    if (r.request) {
      ++accepted;
    } else {
      EXPECT_TRUE(r.error.http_status == 400) << body;
      EXPECT_FALSE(r.error.message.empty());
      EXPECT_TRUE(json::accept(render_error(r.error)));
    }
  }
  EXPECT_GT(accepted, 0u);  // some mutations stay valid (e.g. digits changed)
}

}  // namespace
}  // namespace weft::serve
