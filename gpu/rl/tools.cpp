#include "gpu/rl/tools.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>

#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

namespace weft::gpu::rl {

namespace {

/// A lookup key as the table files it: trimmed, without surrounding quotes, lowercased.
std::string normal_key(std::string_view key) {
  key = trim(key);
  while (!key.empty() && (key.front() == '"' || key.front() == '\'')) key.remove_prefix(1);
  while (!key.empty() && (key.back() == '"' || key.back() == '\'')) key.remove_suffix(1);
  std::string out(key);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

constexpr std::string_view kResultOpen = "<result>";
constexpr std::string_view kResultClose = "</result>";

}  // namespace

bool is_tool(std::string_view name) {
  return name == "calc" || name == "lookup";
}

bool valid_tool_name(std::string_view name) {
  if (name.empty() || name.size() > 24 || name.front() < 'a' || name.front() > 'z') return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
  });
}

result<tool_command> parse_tool_command(std::string_view spec) {
  const size_t eq = spec.find('=');
  if (eq == std::string_view::npos) {
    return status{status_code::invalid_argument, "'" + std::string(spec) + "' is not NAME=COMMAND"};
  }
  tool_command t{std::string(trim(spec.substr(0, eq))), std::string(trim(spec.substr(eq + 1)))};
  if (!valid_tool_name(t.name)) {
    return status{status_code::invalid_argument,
                  "tool name '" + t.name +
                      "': a lowercase letter, then up to 23 lowercase letters, digits or _"};
  }
  if (t.command.empty()) {
    return status{status_code::invalid_argument, "tool '" + t.name + "' has no command"};
  }
  return t;
}

result<std::vector<std::string>> parse_tools(std::string_view list,
                                             const std::vector<std::string>& custom) {
  std::vector<std::string> out;
  while (!list.empty()) {
    const size_t comma = list.find(',');
    const std::string_view item = trim(list.substr(0, comma));
    list = comma == std::string_view::npos ? std::string_view{} : list.substr(comma + 1);
    if (item.empty()) continue;
    if (!is_tool(item) && std::find(custom.begin(), custom.end(), item) == custom.end()) {
      return status{status_code::invalid_argument,
                    "unknown tool '" + std::string(item) + "' (tools: " + tool_list +
                        ", or your own with --tool-cmd NAME=COMMAND)"};
    }
    if (std::find(out.begin(), out.end(), item) == out.end()) out.emplace_back(item);
  }
  return out;
}

std::vector<std::string> tool_stop_strings(const std::vector<std::string>& tools) {
  std::vector<std::string> out;
  for (const auto& t : tools) out.push_back("</" + t + ">");
  return out;
}

bool parse_tool_call(std::string_view turn_text, const std::vector<std::string>& tools,
                     tool_call& out) {
  size_t best = std::string_view::npos;
  for (const auto& t : tools) {
    const std::string open = "<" + t + ">";
    const size_t at = turn_text.rfind(open);
    if (at == std::string_view::npos || (best != std::string_view::npos && at < best)) continue;
    best = at;
    out.tool = t;
    out.args = std::string(turn_text.substr(at + open.size()));
  }
  return best != std::string_view::npos;
}

std::string calculator(std::string_view expression) {
  double value = 0.0;
  std::vector<long long> numbers;
  if (!eval_expression(expression, value, numbers)) {
    return "error: cannot evaluate '" + std::string(trim(expression).substr(0, 40)) + "'";
  }
  if (std::fabs(value) < 9.0e15 && value == std::round(value)) {
    return std::to_string(static_cast<long long>(value));
  }
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.6f", value);
  std::string s = buf;
  while (!s.empty() && s.back() == '0') s.pop_back();
  if (!s.empty() && s.back() == '.') s.pop_back();
  return s;
}

long long lookup_value(std::string_view key) {
  const std::string k = normal_key(key);
  if (k.size() < 3 || k.size() > 12) return -1;
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a over the letters, then mixed
  for (char c : k) {
    if (c < 'a' || c > 'z') return -1;
    h = (h ^ static_cast<unsigned char>(c)) * 0x100000001b3ull;
  }
  return 1 + static_cast<long long>(task_mix(h, 0x7001, 0) % 99);
}

std::string lookup(std::string_view key) {
  const long long v = lookup_value(key);
  if (v < 0) {
    return "error: no entry for '" + std::string(trim(key).substr(0, 40)) +
           "' (keys are words of 3 to 12 letters)";
  }
  return std::to_string(v);
}

std::string run_tool(const tool_call& c) {
  if (c.tool == "calc") return calculator(c.args);
  if (c.tool == "lookup") return lookup(c.args);
  return "error: unknown tool '" + c.tool + "'";
}

std::string tool_observation(std::string_view result) {
  std::string out(kResultOpen);
  out += result;
  out += kResultClose;
  return out;
}

std::string_view final_answer_text(std::string_view transcript) {
  const size_t at = transcript.rfind(kResultClose);
  return at == std::string_view::npos ? transcript : transcript.substr(at + kResultClose.size());
}

status inline_tools::call(uint64_t id, tool_call c) {
  done_.push_back(tool_result{id, run_tool(c)});
  ++calls_;
  return {};
}

std::vector<tool_result> inline_tools::ready(bool) {
  std::vector<tool_result> out(done_.begin(), done_.end());
  done_.clear();
  return out;
}

struct tool_process::impl {
  tool_command cmd;
  json_lines_process proc;
};

tool_process::tool_process(tool_command cmd, double timeout_s, int max_restarts)
    : d_(new impl{cmd, json_lines_process(json_lines_config{cmd.command, timeout_s, max_restarts,
                                                            "the " + cmd.name + " tool's process",
                                                            "{\"id\": N, \"result\": \"...\"}"})}) {
}

tool_process::~tool_process() = default;

std::string tool_process::call(const tool_call& c) {
  std::vector<nlohmann::json> one;
  one.push_back({{"tool", c.tool}, {"args", c.args}});
  auto answers = d_->proc.exchange(std::move(one), [](size_t, const nlohmann::json& j) {
    return j.contains("result") && j["result"].is_string() ? std::string{}
                                                           : std::string{"no string result"};
  });
  if (!answers) {
    spdlog::warn("tool '{}' failed on '{}': {}", c.tool, c.args.substr(0, 80),
                 answers.error().message());
    return "error: the " + c.tool + " tool failed";
  }
  return (*answers)[0]["result"].get<std::string>();
}

int64_t tool_process::restarts() const {
  return d_->proc.restarts();
}

namespace {

std::string tool_instructions(const std::vector<std::string>& tools) {
  std::string s;
  for (const auto& t : tools) {
    if (t == "calc") {
      s += "You have a calculator: write <calc>expression</calc> and its value follows as "
           "<result>value</result>. ";
    } else if (t == "lookup") {
      s += "You have a lookup tool: write <lookup>word</lookup> and the word's value follows as "
           "<result>value</result>. ";
    } else {
      s += "You have a " + t + " tool: write <" + t + ">input</" + t +
           "> and its answer follows as <result>answer</result>. ";
    }
  }
  return s;
}

class tool_task final : public rl_task {
 public:
  tool_task(std::unique_ptr<rl_task> inner, std::vector<std::string> tools)
      : inner_(std::move(inner)), tools_(std::move(tools)), intro_(tool_instructions(tools_)) {}
  std::string name() const override {
    std::string s = inner_->name() + ", tools ";
    for (size_t i = 0; i < tools_.size(); ++i) s += (i ? "," : "") + tools_[i];
    return s;
  }
  int64_t size() const override { return inner_->size(); }
  rl_prompt problem(uint64_t seed, int64_t index) const override {
    rl_prompt p = inner_->problem(seed, index);
    p.text = intro_ + p.text;
    return p;
  }
  double reward(const rl_prompt& p, std::string_view completion) const override {
    return inner_->reward(p, final_answer_text(completion));
  }
  std::string reference_completion(const rl_prompt& p) const override {
    std::string s;
    for (const auto& [tool, args] : p.tool_solution) {
      if (std::find(tools_.begin(), tools_.end(), tool) == tools_.end()) continue;
      s += "<" + tool + ">" + args + "</" + tool + ">";
      s += tool_observation(run_tool(tool_call{tool, args}));
    }
    if (!s.empty()) s += "\n";
    return s + inner_->reference_completion(p);
  }

 private:
  std::unique_ptr<rl_task> inner_;
  std::vector<std::string> tools_;
  std::string intro_;
};

class lookup_task final : public rl_task {
 public:
  explicit lookup_task(int count) : count_(count) {}
  std::string name() const override {
    return count_ == 1 ? "lookup of 1 word"
                       : "lookup sum of 1 to " + std::to_string(count_) + " words";
  }
  int64_t size() const override { return 0; }
  rl_prompt problem(uint64_t seed, int64_t index) const override {
    rl_prompt p;
    long long sum = 0;
    std::string values;
    p.text = "What is ";
    const int words = 1 + static_cast<int>(task_mix(seed, 0x0FFF, static_cast<uint64_t>(index)) %
                                           static_cast<uint64_t>(count_));
    for (int w = 0; w < words; ++w) {
      std::string word;
      for (int i = 0; i < 5; ++i) {
        const uint64_t r =
            task_mix(seed, 0x1000 + static_cast<uint64_t>(w * 8 + i), static_cast<uint64_t>(index));
        word.push_back(static_cast<char>('a' + r % 26));
      }
      const long long v = lookup_value(word);
      sum += v;
      p.key += (w ? "+" : "") + word;
      p.text += std::string(w ? " plus " : "") + "the value of \"" + word + "\"";
      p.tool_solution.push_back({"lookup", word});
      values += (w ? " + " : "") + std::to_string(v);
    }
    p.text += "? Answer with the number only.";
    if (words > 1) p.tool_solution.push_back({"calc", values});
    p.answer = std::to_string(sum);
    return p;
  }
  double reward(const rl_prompt& p, std::string_view completion) const override {
    return answer_is_last_integer(p, completion);
  }

 private:
  int count_;
};

}  // namespace

std::unique_ptr<rl_task> make_tool_task(std::unique_ptr<rl_task> inner,
                                        std::vector<std::string> tools) {
  return std::make_unique<tool_task>(std::move(inner), std::move(tools));
}

std::unique_ptr<rl_task> make_lookup_task(int count) {
  return std::make_unique<lookup_task>(count);
}

}  // namespace weft::gpu::rl
