#include <gtest/gtest.h>

#include <cstdlib>
#include <limits>
#include <thread>
#include <vector>

#include "actors/serve/metrics.hpp"

namespace weft::serve {
namespace {

TEST(metrics, counter_renders_help_type_and_series) {
  metrics_registry m;
  m.declare_counter("weft_requests_total", "Requests served", {});
  m.inc("weft_requests_total", {{"endpoint", "chat"}, {"code", "200"}});
  m.inc("weft_requests_total", {{"endpoint", "chat"}, {"code", "200"}}, 2);
  m.inc("weft_requests_total", {{"endpoint", "completions"}, {"code", "400"}}, 0.5);
  EXPECT_EQ(m.value("weft_requests_total", {{"endpoint", "chat"}, {"code", "200"}}), 3.0);
  EXPECT_EQ(m.render(),
            "# HELP weft_requests_total Requests served\n"
            "# TYPE weft_requests_total counter\n"
            "weft_requests_total{endpoint=\"chat\",code=\"200\"} 3\n"
            "weft_requests_total{endpoint=\"completions\",code=\"400\"} 0.5\n");
}

TEST(metrics, unlabeled_series_and_families_sorted_by_name) {
  metrics_registry m;
  m.declare_gauge("zeta", "last");
  m.declare_counter("alpha_total", "first");
  m.inc("alpha_total");
  m.set("zeta", 7);
  EXPECT_EQ(m.render(),
            "# HELP alpha_total first\n"
            "# TYPE alpha_total counter\n"
            "alpha_total 1\n"
            "# HELP zeta last\n"
            "# TYPE zeta gauge\n"
            "zeta 7\n");
}

TEST(metrics, counters_start_at_zero_and_open_ended_families_render_only_their_header) {
  metrics_registry m;
  m.declare_counter("idle_total", "never touched");
  m.declare_counter("by_code_total", "open-ended labels", {});
  m.declare_counter("by_outcome_total", "known labels",
                    {{{"outcome", "ok"}}, {{"outcome", "error"}}});
  EXPECT_EQ(m.render(),
            "# HELP by_code_total open-ended labels\n# TYPE by_code_total counter\n"
            "# HELP by_outcome_total known labels\n# TYPE by_outcome_total counter\n"
            "by_outcome_total{outcome=\"error\"} 0\nby_outcome_total{outcome=\"ok\"} 0\n"
            "# HELP idle_total never touched\n# TYPE idle_total counter\nidle_total 0\n");
}

TEST(metrics, a_mirrored_counter_takes_the_sources_value_and_gauges_refuse_it) {
  metrics_registry m;
  m.declare_counter("steps_total", "a worker's own count", {});
  m.declare_gauge("level", "a gauge");
  m.set_total("steps_total", {{"worker", "w1"}}, 40);
  m.set_total("steps_total", {{"worker", "w1"}}, 3);  // the worker restarted: a counter reset
  EXPECT_EQ(m.value("steps_total", {{"worker", "w1"}}), 3.0);
  m.set_total("steps_total", {{"worker", "w1"}}, -1);  // never negative
  EXPECT_EQ(m.value("steps_total", {{"worker", "w1"}}), 3.0);
  m.set_total("level", {}, 5);  // not a counter: ignored
  EXPECT_EQ(m.value("level"), 0.0);
  m.set("steps_total", {{"worker", "w1"}}, 9);  // set() is for gauges only
  EXPECT_EQ(m.value("steps_total", {{"worker", "w1"}}), 3.0);
}

TEST(metrics, gauge_set_overwrites_and_inc_adds) {
  metrics_registry m;
  m.declare_gauge("in_flight", "Requests in flight");
  m.set("in_flight", 5);
  m.set("in_flight", 2);
  EXPECT_EQ(m.value("in_flight"), 2.0);
  m.inc("in_flight", {}, 3);
  EXPECT_EQ(m.value("in_flight"), 5.0);
  m.set("in_flight", -1.5);
  EXPECT_EQ(m.value("in_flight"), -1.5);
  EXPECT_NE(m.render().find("\nin_flight -1.5\n"), std::string::npos);
}

TEST(metrics, histogram_buckets_are_cumulative) {
  metrics_registry m;
  m.declare_histogram("lat_seconds", "Latency", {0.25, 0.5, 1});
  // Values exact in binary, so the sum prints exactly; 0.25 and 0.5 sit on bounds (le is
  // inclusive).
  for (double v : {0.125, 0.25, 0.375, 0.75, 2.0, 0.5}) m.observe("lat_seconds", v);
  EXPECT_EQ(m.count("lat_seconds"), 6u);
  EXPECT_EQ(m.render(),
            "# HELP lat_seconds Latency\n"
            "# TYPE lat_seconds histogram\n"
            "lat_seconds_bucket{le=\"0.25\"} 2\n"
            "lat_seconds_bucket{le=\"0.5\"} 4\n"
            "lat_seconds_bucket{le=\"1\"} 5\n"
            "lat_seconds_bucket{le=\"+Inf\"} 6\n"
            "lat_seconds_sum 4\n"
            "lat_seconds_count 6\n");
}

TEST(metrics, histogram_with_labels_puts_le_last) {
  metrics_registry m;
  m.declare_histogram("ttft_seconds", "TTFT", {1, 2});
  m.observe("ttft_seconds", {{"model", "tiny"}}, 1.5);
  m.observe("ttft_seconds", {{"model", "tiny"}}, 3);
  EXPECT_EQ(m.count("ttft_seconds", {{"model", "tiny"}}), 2u);
  EXPECT_EQ(m.count("ttft_seconds"), 0u);
  EXPECT_EQ(m.render(),
            "# HELP ttft_seconds TTFT\n"
            "# TYPE ttft_seconds histogram\n"
            "ttft_seconds_bucket{model=\"tiny\",le=\"1\"} 0\n"
            "ttft_seconds_bucket{model=\"tiny\",le=\"2\"} 1\n"
            "ttft_seconds_bucket{model=\"tiny\",le=\"+Inf\"} 2\n"
            "ttft_seconds_sum{model=\"tiny\"} 4.5\n"
            "ttft_seconds_count{model=\"tiny\"} 2\n");
}

TEST(metrics, histogram_bounds_are_sorted_and_deduplicated) {
  metrics_registry m;
  m.declare_histogram("h", "h", {2, 1, 1, std::numeric_limits<double>::infinity()});
  m.observe("h", 1);
  const std::string out = m.render();
  EXPECT_NE(out.find("h_bucket{le=\"1\"} 1\nh_bucket{le=\"2\"} 1\nh_bucket{le=\"+Inf\"} 1\n"),
            std::string::npos)
      << out;
}

TEST(metrics, label_values_and_help_are_escaped) {
  metrics_registry m;
  m.declare_counter("esc_total", "a \\ help\nwith \"quotes\"", {});
  m.inc("esc_total", {{"path", "a\\b\"c\nd"}});
  EXPECT_EQ(m.render(),
            "# HELP esc_total a \\\\ help\\nwith \"quotes\"\n"
            "# TYPE esc_total counter\n"
            "esc_total{path=\"a\\\\b\\\"c\\nd\"} 1\n");
}

TEST(metrics, number_formats) {
  metrics_registry m;
  m.declare_gauge("g", "g");
  auto line = [&](double v) {
    m.set("g", v);
    const std::string out = m.render();
    const auto pos = out.find("\ng ");
    return out.substr(pos + 3, out.size() - pos - 4);
  };
  EXPECT_EQ(line(3), "3");
  EXPECT_EQ(line(0), "0");
  EXPECT_EQ(line(-0.0), "0");
  EXPECT_EQ(line(0.25), "0.25");
  EXPECT_EQ(line(-7), "-7");
  EXPECT_EQ(line(1048576), "1048576");
  EXPECT_EQ(line(123456789012), "123456789012");
  EXPECT_EQ(line(1e20), "1e+20");
  EXPECT_EQ(line(1.5e-7), "1.5e-07");
  EXPECT_EQ(line(0.1 + 0.2), "0.30000000000000004");  // round-trips exactly
  EXPECT_EQ(line(std::numeric_limits<double>::infinity()), "+Inf");
  EXPECT_EQ(line(-std::numeric_limits<double>::infinity()), "-Inf");
  EXPECT_EQ(line(std::numeric_limits<double>::quiet_NaN()), "NaN");
}

TEST(metrics, misuse_is_ignored_not_fatal) {
  metrics_registry m;
  m.declare_counter("c_total", "c");
  m.declare_gauge("c_total", "redeclared as gauge");  // ignored: kind kept
  m.declare_counter("c_total", "again");              // no-op
  m.declare_counter("bad name", "x");                 // invalid: not declared
  m.declare_counter("9starts_with_digit", "x");
  m.inc("c_total", {}, -1);     // counters only go up
  m.set("c_total", {}, 5);      // not a gauge
  m.observe("c_total", {}, 1);  // not a histogram
  m.inc("undeclared_total");
  m.inc("c_total", {{"bad-label", "v"}});
  m.inc("c_total", {{"__reserved", "v"}});
  m.declare_histogram("h", "h", {1});
  m.observe("h", {{"le", "x"}}, 0.5);  // le is reserved on histograms
  m.observe("h", std::numeric_limits<double>::quiet_NaN());
  m.inc("h");
  EXPECT_EQ(m.value("c_total"), 0.0);
  EXPECT_EQ(m.count("h"), 0u);
  EXPECT_EQ(m.value("undeclared_total"), 0.0);
  EXPECT_EQ(m.render(),
            "# HELP c_total c\n"
            "# TYPE c_total counter\n"
            "c_total 0\n"
            "# HELP h h\n"
            "# TYPE h histogram\n");
}

TEST(metrics, label_order_is_part_of_the_series) {
  metrics_registry m;
  m.declare_counter("o_total", "o");
  m.inc("o_total", {{"a", "1"}, {"b", "2"}});
  m.inc("o_total", {{"a", "1"}, {"b", "2"}});
  m.inc("o_total", {{"a", "1"}, {"b", "3"}});
  EXPECT_EQ(m.value("o_total", {{"a", "1"}, {"b", "2"}}), 2.0);
  EXPECT_EQ(m.value("o_total", {{"a", "1"}, {"b", "3"}}), 1.0);
  EXPECT_EQ(m.value("o_total", {{"a", "1"}}), 0.0);
}

TEST(metrics, concurrent_updates_are_all_counted) {
  metrics_registry m;
  m.declare_counter("hits_total", "hits");
  m.declare_histogram("lat", "lat", metrics_registry::latency_buckets_s());
  constexpr int threads = 4;
  constexpr int per_thread = 5000;
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&m, t] {
      for (int i = 0; i < per_thread; ++i) {
        m.inc("hits_total", {{"t", std::to_string(t % 2)}});
        m.observe("lat", 0.001 * (i % 100));
        if (i % 500 == 0) (void)m.render();
      }
    });
  }
  for (auto& th : pool) th.join();
  EXPECT_EQ(m.value("hits_total", {{"t", "0"}}) + m.value("hits_total", {{"t", "1"}}),
            threads * per_thread);
  EXPECT_EQ(m.count("lat"), static_cast<uint64_t>(threads * per_thread));
  const std::string out = m.render();
  EXPECT_NE(out.find("lat_bucket{le=\"+Inf\"} 20000\n"), std::string::npos);
  EXPECT_NE(out.find("lat_count 20000\n"), std::string::npos);
}

TEST(metrics, latency_buckets_are_ascending_and_cover_ms_to_minutes) {
  const auto b = metrics_registry::latency_buckets_s();
  ASSERT_GE(b.size(), 8u);
  for (size_t i = 1; i < b.size(); ++i) EXPECT_LT(b[i - 1], b[i]);
  EXPECT_LE(b.front(), 0.001);
  EXPECT_GE(b.back(), 60.0);
}

// A minimal check of the exposition grammar over a rendered registry: every non-comment line is
// `name{labels} value` with a known family name prefix and a parseable value.
TEST(metrics, every_line_follows_the_text_format) {
  metrics_registry m;
  m.declare_counter("a_total", "a", {});
  m.declare_gauge("b", "b");
  m.declare_histogram("c_seconds", "c", {0.5});
  m.inc("a_total", {{"x", "q\"uote"}});
  m.set("b", 1e-3);
  m.observe("c_seconds", {{"k", "v"}}, 0.25);
  const std::string out = m.render();
  ASSERT_FALSE(out.empty());
  EXPECT_EQ(out.back(), '\n');
  size_t start = 0;
  int samples = 0;
  while (start < out.size()) {
    const size_t end = out.find('\n', start);
    const std::string line = out.substr(start, end - start);
    start = end + 1;
    if (line.starts_with("# HELP ") || line.starts_with("# TYPE ")) continue;
    const size_t sp = line.rfind(' ');
    ASSERT_NE(sp, std::string::npos) << line;
    const std::string value = line.substr(sp + 1);
    char* parse_end = nullptr;
    (void)std::strtod(value.c_str(), &parse_end);
    EXPECT_TRUE(*parse_end == '\0' || value == "+Inf" || value == "NaN") << line;
    EXPECT_TRUE(line.starts_with("a_total") || line.starts_with("b") ||
                line.starts_with("c_seconds"))
        << line;
    ++samples;
  }
  EXPECT_EQ(samples, 1 + 1 + 4);
}

}  // namespace
}  // namespace weft::serve
