#include "gpu/rl/reward_process.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <thread>

namespace weft::gpu::rl {

reward_process::reward_process(reward_process_config config)
    : proc_(json_lines_config{std::move(config.command), config.timeout_s, config.max_restarts,
                              "the reward process", "{\"id\": N, \"reward\": X}"}) {}

result<std::vector<double>> reward_process::score(std::span<const reward_request> items) {
  std::vector<nlohmann::json> requests;
  requests.reserve(items.size());
  for (const auto& it : items) {
    requests.push_back(
        {{"prompt", it.prompt}, {"completion", it.completion}, {"answer", it.answer}});
  }
  auto answers = proc_.exchange(std::move(requests), [&items](size_t i, const nlohmann::json& j) {
    if (j.contains("reward") && j["reward"].is_number() &&
        std::isfinite(j["reward"].get<double>())) {
      return std::string{};
    }
    std::string completion = items[i].completion;
    if (completion.size() > 200) completion = completion.substr(0, 200) + "...";
    return "the reward process gave sample " + std::to_string(i) + " (completion '" + completion +
           "') no finite reward";
  });
  if (!answers) return answers.error();
  std::vector<double> out;
  out.reserve(answers->size());
  for (const auto& a : *answers) out.push_back(a["reward"].get<double>());
  return out;
}

reward_process_pool::reward_process_pool(const reward_process_config& config, int processes) {
  for (int i = 0; i < std::max(1, processes); ++i) {
    procs_.push_back(std::make_unique<reward_process>(config));
    free_.push_back(procs_.size() - 1);
  }
}

result<std::vector<double>> reward_process_pool::score(std::span<const reward_request> items) {
  size_t k = 0;
  {
    std::unique_lock lock(mu_);
    freed_.wait(lock, [this] { return !free_.empty(); });
    k = free_.front();
    free_.pop_front();
  }
  auto rewards = procs_[k]->score(items);
  {
    std::lock_guard lock(mu_);
    free_.push_back(k);
  }
  freed_.notify_one();
  return rewards;
}

result<std::vector<double>> reward_process_pool::score_split(
    std::span<const reward_request> items) {
  if (items.empty()) return std::vector<double>{};
  std::vector<size_t> copies;
  {
    std::unique_lock lock(mu_);
    freed_.wait(lock, [this] { return !free_.empty(); });
    const size_t n = std::min(free_.size(), std::max<size_t>(1, items.size()));
    for (size_t i = 0; i < n; ++i) {
      copies.push_back(free_.front());
      free_.pop_front();
    }
  }
  const size_t n = copies.size();
  auto begin = [&](size_t j) { return items.size() * j / n; };
  std::vector<result<std::vector<double>>> parts(n, std::vector<double>{});
  auto run = [&](size_t j) {
    parts[j] = procs_[copies[j]]->score(items.subspan(begin(j), begin(j + 1) - begin(j)));
  };
  {
    std::vector<std::jthread> others;
    for (size_t j = 1; j < n; ++j) others.emplace_back(run, j);
    run(0);
  }  // joined
  {
    std::lock_guard lock(mu_);
    for (size_t k : copies) free_.push_back(k);
  }
  freed_.notify_all();
  std::vector<double> out;
  out.reserve(items.size());
  for (size_t j = 0; j < n; ++j) {
    if (!parts[j].ok()) {
      if (n == 1) return parts[j].error();
      return status{parts[j].error().code(),
                    "samples " + std::to_string(begin(j)) + ".." +
                        std::to_string(begin(j + 1) - 1) +
                        " of the batch (numbered from 0 below): " + parts[j].error().message()};
    }
    out.insert(out.end(), parts[j]->begin(), parts[j]->end());
  }
  return out;
}

int64_t reward_process_pool::restarts() const {
  int64_t n = 0;
  for (const auto& p : procs_) n += p->restarts();
  return n;
}

}  // namespace weft::gpu::rl
