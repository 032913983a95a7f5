// End to end against a tiny OpenAI-like server in the test: fake SSE streams with known delays.
#include <gtest/gtest.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <thread>

#include "apps/loadgen/openai_client.hpp"
#include "apps/loadgen/runner.hpp"
#include "apps/loadgen/stats.hpp"
#include "apps/loadgen/workload.hpp"

namespace lg = weft::apps::loadgen;
using namespace std::chrono_literals;

namespace {

constexpr auto first_token_delay = 80ms;
constexpr auto token_gap = 20ms;

// Streams max_tokens one-token chunks: the first after first_token_delay, then one per token_gap.
class fake_server {
 public:
  fake_server() {
    server_.Get("/v1/models", [](const httplib::Request&, httplib::Response& res) {
      res.set_content(R"({"object":"list","data":[{"id":"fake-model","object":"model"}]})",
                      "application/json");
    });
    server_.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
      const auto body = nlohmann::json::parse(req.body, nullptr, false);
      if (body.is_discarded() || !body.contains("max_tokens") ||
          body.value("model", "") != "fake-model" || !body.value("stream", false) ||
          !body.value("ignore_eos", false)) {
        res.status = 400;
        res.set_content(R"({"error":{"message":"bad request body"}})", "application/json");
        return;
      }
      if (req.get_header_value("Authorization") != "Bearer secret") {
        res.status = 401;
        res.set_content(R"({"error":{"message":"missing api key"}})", "application/json");
        return;
      }
      ++requests_;
      const int64_t n = body["max_tokens"].get<int64_t>();
      res.set_chunked_content_provider("text/event-stream", [n](size_t, httplib::DataSink& sink) {
        std::this_thread::sleep_for(first_token_delay);
        for (int64_t i = 0; i < n; ++i) {
          if (i > 0) std::this_thread::sleep_for(token_gap);
          const nlohmann::json c{{"choices",
                                  {{{"index", 0},
                                    {"text", " tok"},
                                    {"finish_reason", i + 1 == n ? nlohmann::json("length")
                                                                 : nlohmann::json(nullptr)}}}}};
          const std::string ev = "data: " + c.dump() + "\n\n";
          if (!sink.write(ev.data(), ev.size())) return false;
        }
        const std::string tail =
            R"(data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":)" +
            std::to_string(n) +
            R"(,"prompt_tokens_details":{"cached_tokens":2}}})"
            "\n\ndata: [DONE]\n\n";
        sink.write(tail.data(), tail.size());
        sink.done();
        return true;
      });
    });
    // vLLM's /tokenize: a chat message costs 7 tokens of template around its text (1 token here).
    server_.Post("/tokenize", [](const httplib::Request& req, httplib::Response& res) {
      const auto body = nlohmann::json::parse(req.body, nullptr, false);
      const size_t n = body.contains("messages") ? 8 : 1;
      res.set_content(nlohmann::json{{"tokens", std::vector<int>(n, 3)}}.dump(),
                      "application/json");
    });
    port_ = server_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread{[this] { server_.listen_after_bind(); }};
    while (!server_.is_running()) std::this_thread::sleep_for(1ms);
  }
  ~fake_server() {
    server_.stop();
    thread_.join();
  }
  int port() const { return port_; }
  int requests() const { return requests_.load(); }

 private:
  httplib::Server server_;
  int port_ = 0;
  std::thread thread_;
  std::atomic<int> requests_{0};
};

lg::run_config config_for(int port) {
  lg::run_config rc;
  rc.client.server = lg::parse_base_url("http://127.0.0.1:" + std::to_string(port) + "/v1").value();
  rc.client.request.model = "fake-model";
  rc.client.api_key = "secret";
  rc.client.timeout_s = 20;
  rc.progress_interval_s = 0;
  return rc;
}

}  // namespace

TEST(e2e, measures_ttft_and_tpot_of_a_fake_stream) {
  fake_server server;
  auto rc = config_for(server.port());
  auto info = lg::probe_server(rc.client);
  ASSERT_TRUE(info) << info.error();
  ASSERT_EQ(info->model_ids, std::vector<std::string>{"fake-model"});

  std::vector<lg::request_spec> reqs;
  for (size_t i = 0; i < 4; ++i)
    reqs.push_back({i, 0.05 * static_cast<double>(i), " the of and", 3, 6});
  const auto records = lg::run_open_loop(rc, reqs);
  ASSERT_EQ(records.size(), 4u);
  EXPECT_EQ(server.requests(), 4);
  for (const auto& r : records) {
    ASSERT_TRUE(r.ok()) << r.error;
    EXPECT_EQ(r.completion_tokens, 6);
    EXPECT_EQ(r.cached_tokens, 2);
    EXPECT_EQ(r.n_chunks, 6u);
    // Lower bounds are exact (the server sleeps at least this long); upper bounds are generous.
    EXPECT_GE(r.ttft_ms, 80.0);
    EXPECT_LT(r.ttft_ms, 80.0 + 1000.0);
    EXPECT_GE(r.tpot_ms, 19.0);
    EXPECT_LT(r.tpot_ms, 20.0 + 200.0);
    EXPECT_EQ(r.itl_ms.size(), 5u);
    EXPECT_GE(r.e2e_ms, r.ttft_ms + 5 * 19.0);
    EXPECT_LT(r.dispatch_lag_ms, 500.0);
  }
  // Sent open loop at their scheduled times: concurrent, not one after another.
  EXPECT_LT(records[3].sent_s - records[0].sent_s, 0.15 + 0.5);
  const auto s = lg::summarize_run(records, lg::slo_config{5000, 1000});
  EXPECT_EQ(s.n_ok, 4u);
  EXPECT_DOUBLE_EQ(s.slo_attainment, 1.0);
  EXPECT_EQ(s.total_completion_tokens, 24);
  EXPECT_GT(s.output_throughput_tps, 0);
  EXPECT_DOUBLE_EQ(lg::summarize_run(records, lg::slo_config{1.0, 0}).slo_attainment,
                   0.0);  // TTFT > 1 ms
}

TEST(e2e, client_overload_is_recorded_not_delayed) {
  fake_server server;
  auto rc = config_for(server.port());
  rc.max_in_flight = 1;
  std::vector<lg::request_spec> reqs{{0, 0.0, " the", 1, 5}, {1, 0.01, " of", 1, 5}};
  const auto records = lg::run_open_loop(rc, reqs);
  EXPECT_TRUE(records[0].ok()) << records[0].error;
  EXPECT_EQ(records[1].status, lg::request_status::client_overload);
  EXPECT_EQ(server.requests(), 1);
}

TEST(e2e, http_errors_and_unreachable_servers) {
  fake_server server;
  auto rc = config_for(server.port());
  rc.client.api_key = "wrong";
  auto rec = lg::send_request(rc.client, {0, 0.0, " the", 1, 3}, lg::steady_clock::now());
  EXPECT_EQ(rec.status, lg::request_status::http_error);
  EXPECT_EQ(rec.http_status, 401);
  EXPECT_NE(rec.error.find("missing api key"), std::string::npos) << rec.error;

  // A port nobody listens on: bound to a socket that never listens, then closed.
  int dead_port = 0;
  {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    ASSERT_GE(fd, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof addr;
    ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
    dead_port = ntohs(addr.sin_port);
    ::close(fd);
  }
  auto dead = config_for(dead_port);
  auto info = lg::probe_server(dead.client);
  ASSERT_FALSE(info);
  EXPECT_NE(info.error().find("http://127.0.0.1:" + std::to_string(dead_port) + "/v1/models"),
            std::string::npos)
      << info.error();
  auto r2 = lg::send_request(dead.client, {0, 0.0, " the", 1, 3}, lg::steady_clock::now());
  EXPECT_EQ(r2.status, lg::request_status::connection_error);
  EXPECT_NE(r2.error.find("/v1/completions"), std::string::npos) << r2.error;
}

TEST(e2e, chat_prompts_are_shortened_by_what_the_template_adds) {
  fake_server srv;
  auto rc = config_for(srv.port());
  auto overhead = lg::chat_template_overhead(rc.client);
  ASSERT_TRUE(overhead) << overhead.error();
  EXPECT_EQ(overhead.value(), 7);
  lg::workload_config wc;
  wc.num_requests = 3;
  wc.synthetic.prompt = {lg::length_dist::fixed, 20, 1, 20, 1.5, 0.5};
  wc.synthetic.output = {lg::length_dist::fixed, 4, 1, 4, 1.5, 0.5};
  auto plain = lg::build_workload(wc, 1.0);
  wc.prompt_overhead_tokens = overhead.value();
  auto chat = lg::build_workload(wc, 1.0);
  ASSERT_TRUE(plain && chat);
  auto words = [](const std::string& s) { return std::count(s.begin(), s.end(), ' '); };
  EXPECT_EQ(words(plain->requests[0].prompt), 20);
  EXPECT_EQ(words(chat->requests[0].prompt), 13);
  EXPECT_EQ(chat->requests[0].prompt_tokens_target, 20);  // the target is what the model sees
  // A server without /tokenize: an error, so the bench can say so.
  auto none = config_for(1);
  none.client.timeout_s = 2;
  EXPECT_FALSE(lg::chat_template_overhead(none.client));
}

TEST(e2e, base_url_parsing) {
  auto a = lg::parse_base_url("http://localhost:8000/v1/");
  ASSERT_TRUE(a);
  EXPECT_EQ(a->scheme_host_port, "http://localhost:8000");
  EXPECT_EQ(a->path_prefix, "");
  auto b = lg::parse_base_url("http://h:1/api");
  ASSERT_TRUE(b);
  EXPECT_EQ(b->path_prefix, "/api");
  EXPECT_EQ(b->url("/v1/models"), "http://h:1/api/v1/models");
  EXPECT_FALSE(lg::parse_base_url("localhost:8000"));
  EXPECT_FALSE(lg::parse_base_url("http://"));
}
