#include <gtest/gtest.h>

#include "apps/loadgen/stats.hpp"

namespace lg = weft::apps::loadgen;

TEST(stats, percentile_interpolates_like_numpy) {
  std::vector<double> v{1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  EXPECT_DOUBLE_EQ(lg::percentile(v, 50), 5.5);
  EXPECT_NEAR(lg::percentile(v, 90), 9.1, 1e-12);
  EXPECT_NEAR(lg::percentile(v, 99), 9.91, 1e-12);
  EXPECT_DOUBLE_EQ(lg::percentile(v, 0), 1);
  EXPECT_DOUBLE_EQ(lg::percentile(v, 100), 10);
  EXPECT_DOUBLE_EQ(lg::percentile({42}, 99), 42);
  EXPECT_DOUBLE_EQ(lg::percentile({}, 50), 0);
}

TEST(stats, summarize_sorts_and_averages) {
  const auto s = lg::summarize({5, 1, 3});
  EXPECT_EQ(s.count, 3u);
  EXPECT_DOUBLE_EQ(s.mean, 3);
  EXPECT_DOUBLE_EQ(s.p50, 3);
  EXPECT_DOUBLE_EQ(s.min, 1);
  EXPECT_DOUBLE_EQ(s.max, 5);
}

namespace {
lg::request_record ok_record(size_t i, double sent_s, double ttft, double e2e, int64_t out) {
  lg::request_record r;
  r.index = i;
  r.scheduled_s = sent_s;
  r.sent_s = sent_s;
  r.http_status = 200;
  r.ttft_ms = ttft;
  r.e2e_ms = e2e;
  r.completion_tokens = out;
  r.prompt_tokens = 10;
  r.cached_tokens = 4;
  r.tpot_ms = out > 1 ? (e2e - ttft) / static_cast<double>(out - 1) : -1;
  for (int64_t k = 1; k < out; ++k) r.itl_ms.push_back(r.tpot_ms);
  return r;
}
}  // namespace

TEST(stats, run_summary_throughput_and_slo_attainment) {
  std::vector<lg::request_record> recs;
  recs.push_back(ok_record(0, 0.0, 100, 1000, 10));  // tpot 100
  recs.push_back(ok_record(1, 1.0, 300, 1200, 10));  // ttft misses 200
  recs.push_back(ok_record(2, 2.0, 50, 2050, 11));   // tpot 200 misses 150
  recs.push_back(ok_record(3, 3.0, 20, 20, 1));      // single token: no tpot, meets
  lg::request_record failed;
  failed.index = 4;
  failed.scheduled_s = failed.sent_s = 4.0;
  failed.status = lg::request_status::http_error;
  failed.e2e_ms = 5;
  recs.push_back(failed);
  lg::request_record overload;
  overload.index = 5;
  overload.scheduled_s = overload.sent_s = 4.0;
  overload.status = lg::request_status::client_overload;
  recs.push_back(overload);

  const lg::slo_config slo{200, 150};
  const auto s = lg::summarize_run(recs, slo);
  EXPECT_EQ(s.n_requests, 6u);
  EXPECT_EQ(s.n_ok, 4u);
  EXPECT_EQ(s.n_failed, 2u);
  EXPECT_EQ(s.n_client_overload, 1u);
  EXPECT_DOUBLE_EQ(s.slo_attainment, 2.0 / 6.0);  // requests 0 and 3
  // From first send (0 s) to last end (request 2 ends at 4.05 s, the failed one at 4.005 s).
  EXPECT_NEAR(s.duration_s, 4.05, 1e-9);
  EXPECT_EQ(s.total_completion_tokens, 32);
  EXPECT_NEAR(s.output_throughput_tps, 32 / 4.05, 1e-9);
  EXPECT_NEAR(s.request_throughput_rps, 4 / 4.05, 1e-9);
  EXPECT_NEAR(s.offered_rate_rps, 5.0 / 4.0, 1e-9);
  EXPECT_EQ(s.tpot_ms.count, 3u);
  EXPECT_DOUBLE_EQ(s.ttft_ms.max, 300);
  EXPECT_EQ(s.itl_ms.count, 9u + 9u + 10u);
  EXPECT_EQ(s.total_cached_tokens, 16);

  EXPECT_DOUBLE_EQ(lg::summarize_run(recs, lg::slo_config{}).slo_attainment, -1.0);
  EXPECT_TRUE(lg::meets_slo(recs[3], slo));
  EXPECT_FALSE(lg::meets_slo(recs[4], lg::slo_config{}));  // failed requests never meet
}
