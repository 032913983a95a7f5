#include <gtest/gtest.h>

#include "apps/loadgen/openai_stream.hpp"
#include "apps/loadgen/sse_parser.hpp"

namespace lg = weft::apps::loadgen;
using namespace std::chrono_literals;

namespace {
const std::string stream_text =
    ": keep-alive comment\r\n\r\n"
    "data: {\"choices\":[{\"text\":\"Hello\"}]}\r\n\r\n"
    "event: message\n"
    "data: {\"choices\":[{\"text\":\" world\",\n"
    "data: \"finish_reason\":null}]}\n\n"
    "data:{\"choices\":[],\"usage\":{\"prompt_tokens\":7}}\r\r"
    "data: [DONE]\n\n";

std::vector<std::string> parse_in_pieces(const std::string& text, size_t a, size_t b) {
  lg::sse_parser p;
  std::vector<std::string> all;
  for (auto piece : {text.substr(0, a), text.substr(a, b - a), text.substr(b)}) {
    auto ev = p.feed(piece);
    all.insert(all.end(), ev.begin(), ev.end());
  }
  auto rest = p.finish();
  all.insert(all.end(), rest.begin(), rest.end());
  return all;
}
}  // namespace

TEST(sse, same_events_whatever_the_split) {
  const auto whole = parse_in_pieces(stream_text, 0, 0);
  ASSERT_EQ(whole.size(), 4u);
  EXPECT_EQ(whole[0], "{\"choices\":[{\"text\":\"Hello\"}]}");
  EXPECT_EQ(whole[1], "{\"choices\":[{\"text\":\" world\",\n\"finish_reason\":null}]}");
  EXPECT_EQ(whole[2], "{\"choices\":[],\"usage\":{\"prompt_tokens\":7}}");
  EXPECT_EQ(whole[3], "[DONE]");
  for (size_t a = 0; a <= stream_text.size(); ++a) {
    for (size_t b = a; b <= stream_text.size(); b += 7) {
      ASSERT_EQ(parse_in_pieces(stream_text, a, b), whole) << "split at " << a << ", " << b;
    }
  }
}

TEST(sse, byte_at_a_time_and_unterminated_last_event) {
  lg::sse_parser p;
  std::vector<std::string> got;
  const std::string text = "data: a\n\ndata: b";
  for (char c : text) {
    auto ev = p.feed(std::string_view{&c, 1});
    got.insert(got.end(), ev.begin(), ev.end());
  }
  ASSERT_EQ(got.size(), 1u);
  auto rest = p.finish();
  ASSERT_EQ(rest.size(), 1u);
  EXPECT_EQ(rest[0], "b");
  EXPECT_EQ(p.bytes_seen(), text.size());
}

namespace {
std::string chunk(const std::string& text) {
  return "data: {\"choices\":[{\"index\":0,\"text\":\"" + text + "\",\"finish_reason\":null}]}\n\n";
}
}  // namespace

TEST(recorder, ttft_tpot_and_gaps_from_timed_chunks) {
  lg::request_record rec;
  const auto t0 = lg::steady_clock::now();
  lg::stream_recorder r{lg::api_kind::completions, rec, t0};
  r.on_status(200);
  // Token 1 at 100 ms; tokens 2-3 in one chunk at 150 ms; token 4 at 250 ms.
  EXPECT_TRUE(r.on_bytes(chunk("a"), t0 + 100ms));
  EXPECT_TRUE(r.on_bytes(chunk("bc"), t0 + 150ms));
  const std::string last = chunk("d");
  EXPECT_TRUE(
      r.on_bytes(last.substr(0, 10), t0 + 200ms));  // a split chunk counts when it completes
  EXPECT_TRUE(r.on_bytes(last.substr(10), t0 + 250ms));
  EXPECT_TRUE(r.on_bytes(
      "data: {\"choices\":[{\"index\":0,\"text\":\"\",\"finish_reason\":\"length\"}]}\n\n",
      t0 + 251ms));
  EXPECT_TRUE(
      r.on_bytes("data: {\"choices\":[],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":4,"
                 "\"prompt_tokens_details\":{\"cached_tokens\":8}}}\n\ndata: [DONE]\n\n",
                 t0 + 260ms));
  r.finish(lg::request_status::ok, {});
  ASSERT_TRUE(rec.ok()) << rec.error;
  EXPECT_NEAR(rec.ttft_ms, 100, 1e-6);
  EXPECT_NEAR(rec.e2e_ms, 260, 1e-6);
  EXPECT_EQ(rec.completion_tokens, 4);
  EXPECT_EQ(rec.prompt_tokens, 12);
  EXPECT_EQ(rec.cached_tokens, 8);
  EXPECT_TRUE(rec.usage_reported);
  EXPECT_NEAR(rec.tpot_ms, (260.0 - 100.0) / 3, 1e-6);
  ASSERT_EQ(rec.itl_ms.size(), 2u);  // per chunk: 3 content chunks -> 2 gaps
  EXPECT_NEAR(rec.itl_ms[0], 50, 1e-6);
  EXPECT_NEAR(rec.itl_ms[1], 100, 1e-6);
  EXPECT_EQ(rec.finish_reason, "length");
}

TEST(recorder, chat_deltas_and_missing_usage) {
  lg::request_record rec;
  const auto t0 = lg::steady_clock::now();
  lg::stream_recorder r{lg::api_kind::chat, rec, t0};
  r.on_status(200);
  r.on_bytes("data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n",
             t0 + 5ms);
  r.on_bytes("data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\n", t0 + 40ms);
  r.on_bytes(
      "data: {\"choices\":[{\"delta\":{\"content\":\" there\"},\"finish_reason\":\"stop\"}]}\n\n",
      t0 + 60ms);
  r.finish(lg::request_status::ok, {});  // no [DONE], but a finish_reason
  ASSERT_TRUE(rec.ok()) << rec.error;
  EXPECT_NEAR(rec.ttft_ms, 40, 1e-6);  // the role-only chunk is not a token
  EXPECT_FALSE(rec.usage_reported);
  EXPECT_EQ(rec.completion_tokens, 2);  // counted from chunks
  EXPECT_EQ(rec.prompt_tokens, -1);
}

TEST(recorder, errors) {
  const auto t0 = lg::steady_clock::now();
  {
    lg::request_record rec;
    lg::stream_recorder r{lg::api_kind::completions, rec, t0};
    r.on_status(400);
    r.on_bytes("{\"error\":{\"message\":\"max_tokens too large\",\"type\":\"invalid\"}}", t0 + 1ms);
    r.finish(lg::request_status::ok, {});
    EXPECT_EQ(rec.status, lg::request_status::http_error);
    EXPECT_NE(rec.error.find("400"), std::string::npos);
    EXPECT_NE(rec.error.find("max_tokens too large"), std::string::npos);
  }
  {
    lg::request_record rec;
    lg::stream_recorder r{lg::api_kind::completions, rec, t0};
    r.on_status(200);
    r.on_bytes(chunk("a"), t0 + 1ms);
    EXPECT_FALSE(r.on_bytes("data: {\"error\":{\"message\":\"engine died\"}}\n\n", t0 + 2ms));
    r.finish(lg::request_status::ok, {});
    EXPECT_EQ(rec.status, lg::request_status::stream_error);
    EXPECT_NE(rec.error.find("engine died"), std::string::npos);
  }
  {
    lg::request_record rec;
    lg::stream_recorder r{lg::api_kind::completions, rec, t0};
    r.on_status(200);
    r.on_bytes("data: not json\n\n", t0 + 1ms);
    r.finish(lg::request_status::ok, {});
    EXPECT_EQ(rec.status, lg::request_status::stream_error);
  }
  {
    lg::request_record rec;
    lg::stream_recorder r{lg::api_kind::completions, rec, t0};
    r.on_status(200);
    r.on_bytes(chunk("a"), t0 + 1ms);  // cut: no [DONE], no finish_reason
    r.finish(lg::request_status::ok, {});
    EXPECT_EQ(rec.status, lg::request_status::stream_error);
  }
  {
    lg::request_record rec;
    lg::stream_recorder r{lg::api_kind::completions, rec, t0};
    r.finish(lg::request_status::connection_error, "cannot reach http://x");
    EXPECT_EQ(rec.status, lg::request_status::connection_error);
    EXPECT_EQ(rec.error, "cannot reach http://x");
  }
}

TEST(request_body, fields) {
  lg::request_spec spec;
  spec.prompt = " the of";
  spec.max_tokens = 17;
  lg::request_options o;
  o.model = "m";
  auto b = lg::make_request_body(o, spec);
  EXPECT_EQ(b["prompt"], " the of");
  EXPECT_EQ(b["max_tokens"], 17);
  EXPECT_EQ(b["stream"], true);
  EXPECT_EQ(b["stream_options"]["include_usage"], true);
  EXPECT_EQ(b["ignore_eos"], true);
  EXPECT_EQ(b["temperature"], 0.0);
  o.api = lg::api_kind::chat;
  o.eos = lg::eos_mode::respect;
  b = lg::make_request_body(o, spec);
  EXPECT_FALSE(b.contains("ignore_eos"));
  EXPECT_FALSE(b.contains("prompt"));
  EXPECT_EQ(b["messages"][0]["role"], "user");
  EXPECT_EQ(b["messages"][0]["content"], " the of");
}
