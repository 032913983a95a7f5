#include "gpu/rl/tasks.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <fstream>
#include <regex>

namespace weft::gpu::rl {

uint64_t task_mix(uint64_t seed, uint64_t stream, uint64_t index) {  // splitmix64's finaliser
  uint64_t z = seed ^ (stream * 0xD1B54A32D192ED03ull) ^ (index * 0x9E3779B97F4A7C15ull);
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

namespace {

std::string_view first_line(std::string_view s) {
  s = trim(s);
  const size_t nl = s.find('\n');
  return trim(nl == std::string_view::npos ? s : s.substr(0, nl));
}

class arithmetic_task final : public rl_task {
 public:
  arithmetic_task(int digits, std::string ops) : digits_(digits), ops_(std::move(ops)) {
    lo_ = 1;
    for (int i = 1; i < digits_; ++i) lo_ *= 10;
    hi_ = lo_ * 10 - 1;
    if (digits_ == 1) lo_ = 0;
  }
  std::string name() const override { return std::to_string(digits_) + "-digit arithmetic"; }
  int64_t size() const override { return 0; }
  rl_prompt problem(uint64_t seed, int64_t index) const override {
    const uint64_t r = task_mix(seed, 1, static_cast<uint64_t>(index));
    const auto span = static_cast<uint64_t>(hi_ - lo_ + 1);
    const long long a = lo_ + static_cast<long long>(r % span);
    const long long b = lo_ + static_cast<long long>((r / span) % span);
    const char op = ops_[static_cast<size_t>((r >> 48) % ops_.size())];
    const long long value = op == '+' ? a + b : op == '-' ? a - b : a * b;
    rl_prompt p;
    p.key = std::to_string(a) + op + std::to_string(b);
    p.text = "What is " + std::to_string(a) + " " + op + " " + std::to_string(b) +
             "? Answer with the number only.";
    p.answer = std::to_string(value);
    p.tool_solution.push_back({"calc", std::to_string(a) + " " + op + " " + std::to_string(b)});
    return p;
  }
  double reward(const rl_prompt& p, std::string_view completion) const override {
    return answer_is_last_integer(p, completion);
  }

 private:
  int digits_;
  std::string ops_;
  long long lo_ = 0, hi_ = 0;
};

class reverse_task final : public rl_task {
 public:
  explicit reverse_task(int length) : length_(length) {}
  std::string name() const override { return "reverse " + std::to_string(length_) + " letters"; }
  int64_t size() const override { return 0; }
  rl_prompt problem(uint64_t seed, int64_t index) const override {
    std::string word;
    for (int i = 0; i < length_; ++i) {
      word.push_back(static_cast<char>(
          'a' + task_mix(seed, 2 + static_cast<uint64_t>(i), static_cast<uint64_t>(index)) % 26));
    }
    rl_prompt p;
    p.key = word;
    p.text = "Reverse the string \"" + word + "\". Answer with the reversed string only.";
    p.answer.assign(word.rbegin(), word.rend());
    return p;
  }
  double reward(const rl_prompt& p, std::string_view completion) const override {
    std::string got;
    for (char c : first_line(completion)) {
      if (c != '"' && c != '\'' && c != '`' && !std::isspace(static_cast<unsigned char>(c))) {
        got.push_back(c);
      }
    }
    return got == p.answer ? 1.0 : 0.0;
  }

 private:
  int length_;
};

/// Recursive descent over + - * / and parentheses (unary minus allowed).
class expression_parser {
 public:
  explicit expression_parser(std::string_view t) : t_(t) {}
  bool parse(double& value, std::vector<long long>& numbers) {
    numbers_ = &numbers;
    if (!sum(value)) return false;
    skip();
    return i_ == t_.size();
  }

 private:
  void skip() {
    while (i_ < t_.size() && std::isspace(static_cast<unsigned char>(t_[i_]))) ++i_;
  }
  bool sum(double& v) {
    if (!product(v)) return false;
    for (;;) {
      skip();
      if (i_ >= t_.size() || (t_[i_] != '+' && t_[i_] != '-')) return true;
      const char op = t_[i_++];
      double r = 0;
      if (!product(r)) return false;
      v = op == '+' ? v + r : v - r;
    }
  }
  bool product(double& v) {
    if (!factor(v)) return false;
    for (;;) {
      skip();
      if (i_ >= t_.size() || (t_[i_] != '*' && t_[i_] != '/')) return true;
      const char op = t_[i_++];
      double r = 0;
      if (!factor(r)) return false;
      if (op == '/' && r == 0) return false;
      v = op == '*' ? v * r : v / r;
    }
  }
  bool factor(double& v) {
    if (++depth_ > 64) return false;
    skip();
    bool ok = false;
    if (i_ < t_.size() && t_[i_] == '-') {
      ++i_;
      ok = factor(v);
      v = -v;
    } else if (i_ < t_.size() && t_[i_] == '(') {
      ++i_;
      ok = sum(v);
      skip();
      ok = ok && i_ < t_.size() && t_[i_++] == ')';
    } else {
      size_t j = i_;
      long long n = 0;
      while (j < t_.size() && std::isdigit(static_cast<unsigned char>(t_[j])) && j - i_ < 12) {
        n = n * 10 + (t_[j++] - '0');
      }
      ok = j > i_ && (j >= t_.size() || !std::isdigit(static_cast<unsigned char>(t_[j])));
      if (ok) {
        numbers_->push_back(n);
        v = static_cast<double>(n);
        i_ = j;
      }
    }
    --depth_;
    return ok;
  }

  std::string_view t_;
  size_t i_ = 0;
  int depth_ = 0;
  std::vector<long long>* numbers_ = nullptr;
};

class countdown_task final : public rl_task {
 public:
  explicit countdown_task(int count) : count_(count) {}
  std::string name() const override {
    return "countdown with " + std::to_string(count_) + " numbers";
  }
  int64_t size() const override { return 0; }
  rl_prompt problem(uint64_t seed, int64_t index) const override {
    // Numbers, then a random left-to-right expression over all of them (exact division only);
    // its value is the target when it lies in 1..999, else the next attempt.
    for (uint64_t attempt = 0;; ++attempt) {
      const uint64_t base = static_cast<uint64_t>(index) * 64 + attempt;
      std::vector<long long> nums;
      for (int i = 0; i < count_; ++i) {
        nums.push_back(
            1 + static_cast<long long>(task_mix(seed, 40 + static_cast<uint64_t>(i), base) % 25));
      }
      long long value = nums[0];
      bool ok = true;
      for (int i = 1; i < count_ && ok; ++i) {
        const uint64_t r = task_mix(seed, 80 + static_cast<uint64_t>(i), base) % 4;
        const long long n = nums[static_cast<size_t>(i)];
        if (r == 0) value += n;
        if (r == 1) value -= n;
        if (r == 2) value *= n;
        if (r == 3) {
          if (value % n != 0)
            value += n;  // keep it exact
          else
            value /= n;
        }
        ok = std::llabs(value) < 100000;
      }
      if (!ok || value < 1 || value > 999) {
        if (attempt < 63) continue;
        value = nums[0] + nums[1];  // always reachable
      }
      std::string list;
      for (size_t i = 0; i < nums.size(); ++i) list += (i ? ", " : "") + std::to_string(nums[i]);
      rl_prompt p;
      p.key = list + "->" + std::to_string(value);
      p.text = "Using the numbers " + list + ", make " + std::to_string(value) +
               ". Use each number at most once, with + - * / and parentheses. Answer with the "
               "expression only.";
      p.answer = std::to_string(value);
      p.numbers = nums;
      return p;
    }
  }
  double reward(const rl_prompt& p, std::string_view completion) const override {
    // The last run of expression characters that holds an operator (an "= target" after it is
    // cut off).
    std::string best;
    std::string cur;
    auto consider = [&] {
      std::string_view c = trim(cur);
      if (c.find_first_of("+-*/") != std::string_view::npos) best.assign(c);
      cur.clear();
    };
    for (char ch : completion) {
      if (std::isdigit(static_cast<unsigned char>(ch)) ||
          std::string_view("+-*/() ").find(ch) != std::string_view::npos) {
        cur.push_back(ch);
      } else {
        consider();
      }
    }
    consider();
    double value = 0;
    std::vector<long long> used;
    if (best.empty() || !eval_expression(best, value, used)) return 0.0;
    std::vector<long long> left = p.numbers;
    for (long long n : used) {
      auto it = std::find(left.begin(), left.end(), n);
      if (it == left.end()) return 0.0;
      left.erase(it);
    }
    return std::fabs(value - std::stod(p.answer)) < 1e-9 ? 1.0 : 0.0;
  }

 private:
  int count_;
};

/// The decimal numbers in `text` (an optional minus sign, digits, an optional fraction), in order.
std::vector<double> numbers_in(std::string_view text) {
  static const std::regex number(R"((^|[^0-9])(-?[0-9]+(\.[0-9]+)?))");
  std::vector<double> out;
  const std::string s(text);
  for (auto it = std::sregex_iterator(s.begin(), s.end(), number); it != std::sregex_iterator();
       ++it) {
    if ((*it)[2].length() > 30) continue;
    out.push_back(std::stod((*it)[2].str()));
  }
  return out;
}

class dataset_task final : public rl_task {
 public:
  dataset_task(std::string name, std::vector<rl_prompt> lines, answer_match match)
      : name_(std::move(name)), lines_(std::move(lines)), match_(match) {}
  std::string name() const override { return name_; }
  int64_t size() const override { return static_cast<int64_t>(lines_.size()); }
  rl_prompt problem(uint64_t, int64_t index) const override {
    return lines_[static_cast<size_t>(index)];
  }
  double reward(const rl_prompt& p, std::string_view completion) const override {
    switch (match_) {
      case answer_match::number: {
        const auto got_all = numbers_in(completion), want_all = numbers_in(p.answer);
        if (got_all.empty() || want_all.empty()) return 0.0;
        const double got = got_all.back(), want = want_all.front();
        return std::fabs(got - want) <= 1e-9 * std::max(1.0, std::fabs(want)) ? 1.0 : 0.0;
      }
      case answer_match::exact:
        return first_line(completion) == trim(p.answer) ? 1.0 : 0.0;
      case answer_match::contains:
        return completion.find(trim(p.answer)) != std::string_view::npos ? 1.0 : 0.0;
    }
    return 0.0;
  }

 private:
  std::string name_;
  std::vector<rl_prompt> lines_;
  answer_match match_;
};

}  // namespace

bool last_integer(std::string_view text, long long& out) {
  size_t end = text.size();
  while (end > 0 && !std::isdigit(static_cast<unsigned char>(text[end - 1]))) --end;
  if (end == 0) return false;
  size_t start = end;
  while (start > 0 && std::isdigit(static_cast<unsigned char>(text[start - 1]))) --start;
  if (end - start > 18) return false;  // absurdly long: no answer
  long long v = 0;
  for (size_t j = start; j < end; ++j) v = v * 10 + (text[j] - '0');
  const bool neg = start > 0 && text[start - 1] == '-' &&
                   (start == 1 || !std::isdigit(static_cast<unsigned char>(text[start - 2])));
  out = neg ? -v : v;
  return true;
}

double answer_is_last_integer(const rl_prompt& p, std::string_view completion) {
  long long got = 0;
  return last_integer(completion, got) && std::to_string(got) == p.answer ? 1.0 : 0.0;
}

std::unique_ptr<rl_task> make_arithmetic_task(int digits, std::string ops) {
  digits = std::clamp(digits, 1, 9);
  if (ops.empty()) ops = "+";
  return std::make_unique<arithmetic_task>(digits, std::move(ops));
}

namespace {

class answer_format_task final : public rl_task {
 public:
  answer_format_task(std::unique_ptr<rl_task> inner, double format_weight)
      : inner_(std::move(inner)), format_weight_(format_weight) {}
  std::string name() const override { return inner_->name() + ", <answer> format"; }
  int64_t size() const override { return inner_->size(); }
  rl_prompt problem(uint64_t seed, int64_t index) const override {
    rl_prompt p = inner_->problem(seed, index);
    if (const auto at = p.text.rfind(" Answer with"); at != std::string::npos) p.text.resize(at);
    p.text += " Think it through, then give the final answer inside <answer></answer> tags.";
    return p;
  }
  double reward(const rl_prompt& p, std::string_view completion) const override {
    const auto close = completion.rfind("</answer>");
    if (close == std::string_view::npos) return 0.0;
    const auto tail = completion.substr(close + 9);
    if (tail.find_first_not_of(" \t\r\n") != std::string_view::npos) return 0.0;
    const auto open = completion.rfind("<answer>", close);
    if (open == std::string_view::npos) return 0.0;
    const auto inside = completion.substr(open + 8, close - open - 8);
    return format_weight_ + (1.0 - format_weight_) * inner_->reward(p, inside);
  }
  std::string reference_completion(const rl_prompt& p) const override {
    return "<answer>" + inner_->reference_completion(p) + "</answer>";
  }

 private:
  std::unique_ptr<rl_task> inner_;
  double format_weight_;
};

}  // namespace

std::unique_ptr<rl_task> make_answer_format_task(std::unique_ptr<rl_task> inner,
                                                 double format_weight) {
  return std::make_unique<answer_format_task>(std::move(inner), format_weight);
}

bool eval_expression(std::string_view text, double& value, std::vector<long long>& numbers) {
  numbers.clear();
  return expression_parser(text).parse(value, numbers) && std::isfinite(value);
}

std::unique_ptr<rl_task> make_countdown_task(int count) {
  return std::make_unique<countdown_task>(std::clamp(count, 2, 6));
}

std::unique_ptr<rl_task> make_reverse_task(int length) {
  return std::make_unique<reverse_task>(std::clamp(length, 1, 64));
}

bool parse_answer_match(const std::string& name, answer_match& out) {
  if (name == "number") {
    out = answer_match::number;
  } else if (name == "exact") {
    out = answer_match::exact;
  } else if (name == "contains") {
    out = answer_match::contains;
  } else {
    return false;
  }
  return true;
}

result<std::unique_ptr<rl_task>> load_prompt_dataset(const std::filesystem::path& path,
                                                     answer_match match, bool need_answer) {
  std::ifstream in(path);
  if (!in) return status{status_code::not_found, "cannot read " + path.string()};
  std::vector<rl_prompt> lines;
  std::vector<std::string> bad;
  int64_t bad_count = 0;
  std::string line;
  for (int64_t no = 1; std::getline(in, line); ++no) {
    if (trim(line).empty()) continue;
    auto fail = [&](const std::string& why) {
      if (++bad_count <= 20) bad.push_back(path.string() + ":" + std::to_string(no) + ": " + why);
    };
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object()) {
      fail("not a JSON object");
      continue;
    }
    if (!j.contains("prompt") || !j["prompt"].is_string() ||
        j["prompt"].get<std::string>().empty()) {
      fail("needs \"prompt\": a non-empty string");
      continue;
    }
    rl_prompt p;
    p.text = j["prompt"].get<std::string>();
    if (j.contains("answer") && j["answer"].is_string()) {
      p.answer = j["answer"].get<std::string>();
    } else if (j.contains("answer") && j["answer"].is_number()) {
      p.answer = j["answer"].dump();
    } else if (need_answer || j.contains("answer")) {
      fail(need_answer ? "needs \"answer\": a string or a number"
                       : "\"answer\" must be a string or a number");
      continue;
    }
    if (need_answer && match == answer_match::number && numbers_in(p.answer).empty()) {
      fail("\"answer\" has no number (--match number)");
      continue;
    }
    p.key = p.text;
    lines.push_back(std::move(p));
  }
  if (bad_count > 0) {
    std::string msg = std::to_string(bad_count) + " bad line(s) in " + path.string() + ":";
    for (const auto& b : bad) msg += "\n  " + b;
    return status{status_code::invalid_argument, msg};
  }
  if (lines.empty())
    return status{status_code::invalid_argument, path.string() + " has no prompts"};
  return std::unique_ptr<rl_task>(
      std::make_unique<dataset_task>(path.filename().string(), std::move(lines), match));
}

prompt_source::prompt_source(const rl_task& task, uint64_t seed, int64_t eval_size)
    : task_(&task), seed_(seed) {
  const int64_t n = task.size();
  if (n > 0) {
    // A dataset: the last eval_size lines are held out (at least one line stays for training).
    const int64_t held = std::clamp<int64_t>(eval_size, 0, n - 1);
    for (int64_t i = n - held; i < n; ++i) {
      eval_.push_back(task.problem(seed, i));
      held_out_.insert(eval_.back().key);
    }
    for (int64_t i = 0; i < n - held; ++i) train_lines_.push_back(i);
    return;
  }
  // Procedural: distinct problems of the evaluation seed (a bounded number of draws, so a task
  // with fewer distinct problems than eval_size does not loop forever).
  const uint64_t eval_seed = task_mix(seed, 0xE7A1, 0);
  for (int64_t i = 0; static_cast<int64_t>(eval_.size()) < eval_size && i < eval_size * 64; ++i) {
    rl_prompt p = task.problem(eval_seed, i);
    if (held_out_.insert(p.key).second) eval_.push_back(std::move(p));
  }
}

rl_prompt prompt_source::at(int64_t n) {
  const auto lines = static_cast<int64_t>(train_lines_.size());
  const int64_t epoch = n / lines;
  if (epoch != perm_epoch_) {
    perm_ = train_lines_;
    for (int64_t i = lines - 1; i > 0; --i) {
      const auto j = static_cast<int64_t>(
          task_mix(seed_, 0xE90C + static_cast<uint64_t>(epoch), static_cast<uint64_t>(i)) %
          static_cast<uint64_t>(i + 1));
      std::swap(perm_[static_cast<size_t>(i)], perm_[static_cast<size_t>(j)]);
    }
    perm_epoch_ = epoch;
  }
  return task_->problem(seed_, perm_[static_cast<size_t>(n % lines)]);
}

rl_prompt prompt_source::next() {
  if (task_->size() > 0) return at(cursor_++);
  // Procedural: skip held-out problems (a task whose every problem is held out would loop: the
  // evaluation set is bounded by construction, so after enough draws an unseen one comes).
  for (;;) {
    rl_prompt p = task_->problem(seed_, draw_++);
    if (held_out_.count(p.key) == 0 || draw_ > (cursor_ + 1) * 1024) {
      ++cursor_;
      return p;
    }
  }
}

void prompt_source::set_cursor(int64_t c) {
  if (task_->size() > 0) {
    cursor_ = c;
    return;
  }
  cursor_ = 0;
  draw_ = 0;
  while (cursor_ < c) next();
}

}  // namespace weft::gpu::rl
