#include "apps/reward_http.hpp"

#include "actors/rl/tool_http.hpp"

#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include <cmath>

namespace weft::apps {

gpu::result<reward_http> reward_http::create(reward_http_config config) {
  reward_http r;
  if (!weft::rl::split_http_url(config.url, r.host_port_, r.path_)) {
    return gpu::status{gpu::status_code::invalid_argument,
                       "--reward-url " + config.url + ": expected http://host[:port][/path]"};
  }
  r.config_ = std::move(config);
  return r;
}

gpu::result<std::vector<double>> reward_http::score(
    std::span<const gpu::rl::reward_request> items) const {
  nlohmann::json samples = nlohmann::json::array();
  for (size_t i = 0; i < items.size(); ++i) {
    samples.push_back({{"id", i},
                       {"prompt", items[i].prompt},
                       {"completion", items[i].completion},
                       {"answer", items[i].answer}});
  }
  weft::rl::http_post p;
  p.base = host_port_;
  p.path = path_;
  p.body = nlohmann::json{{"samples", samples}}.dump(-1, ' ', false,
                                                     nlohmann::json::error_handler_t::replace);
  if (!config_.api_key.empty())
    p.headers.emplace_back("Authorization", "Bearer " + config_.api_key);
  p.timeout_s = config_.timeout_s;
  p.max_sends = config_.max_retries + 1;
  p.first_pause_ms = 400;
  auto res = weft::rl::post_with_retries(p, [&](const std::string& why, int resend) {
    retries_->fetch_add(1, std::memory_order_relaxed);
    spdlog::warn("reward endpoint {}: {}; sending the {} sample(s) again ({} of {})", config_.url,
                 why, items.size(), resend, config_.max_retries);
  });
  if (!res) {
    return gpu::status{gpu::status_code::internal,
                       "reward endpoint " + config_.url + ": " + res.error().message() + " after " +
                           std::to_string(config_.max_retries) + " retries"};
  }
  if (res->status != 200) {
    return gpu::status{gpu::status_code::invalid_argument,
                       "reward endpoint " + config_.url + " refused the batch: HTTP " +
                           std::to_string(res->status) + " " + res->body.substr(0, 200)};
  }
  const auto j = nlohmann::json::parse(res->body, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("rewards") || !j["rewards"].is_array()) {
    return gpu::status{gpu::status_code::invalid_argument,
                       "reward endpoint " + config_.url +
                           ": the answer is not {\"rewards\": [...]}: " + res->body.substr(0, 200)};
  }
  const auto& r = j["rewards"];
  if (r.size() != items.size()) {
    return gpu::status{gpu::status_code::invalid_argument,
                       "reward endpoint " + config_.url + " gave " + std::to_string(r.size()) +
                           " rewards for " + std::to_string(items.size()) + " samples"};
  }
  std::vector<double> out;
  for (size_t i = 0; i < r.size(); ++i) {
    if (!r[i].is_number() || !std::isfinite(r[i].get<double>())) {
      return gpu::status{gpu::status_code::invalid_argument,
                         "reward endpoint " + config_.url + ": the reward of sample " +
                             std::to_string(i) + " ('" + items[i].completion.substr(0, 40) +
                             "') is " + r[i].dump() + ", not a finite number"};
    }
    out.push_back(r[i].get<double>());
  }
  return out;
}

}  // namespace weft::apps
