#include "gpu/rl/reward_process.hpp"

#include <nlohmann/json.hpp>

#include <cmath>

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

}  // namespace weft::gpu::rl
