#pragma once
/// RL prompts and their verifiers (docs/rl.md): built-in procedural tasks (k-digit arithmetic,
/// string reversal) and JSON-lines datasets of {"prompt", "answer"}; a deterministic stream of
/// training prompts from a seed and a held-out evaluation set that training never draws from.
/// Plain classes, no CAF.

#include <array>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "gpu/status.hpp"

namespace weft::gpu::rl {

/// One problem: the user message, the reference answer, and a key that identifies the problem
/// (two prompts with one key are the same problem).
struct rl_prompt {
  std::string key;
  std::string text;
  std::string answer;
  std::vector<long long> numbers;  ///< Countdown: the numbers the answer may use.
  /// Tool calls {tool, arguments} that solve it (gpu/rl/tools.hpp): what a tool task's
  /// reference completion calls before the answer. Empty for a problem no tool helps with.
  std::vector<std::array<std::string, 2>> tool_solution;
};

/// A stateless 64-bit mix of (seed, stream, index): every procedural problem is a pure function
/// of its coordinates, the same on every platform.
uint64_t task_mix(uint64_t seed, uint64_t stream, uint64_t index);

/// `s` without leading and trailing whitespace.
std::string_view trim(std::string_view s);

/// A task: where problems come from and how a completion is scored.
class rl_task {
 public:
  virtual ~rl_task() = default;
  virtual std::string name() const = 0;
  /// Problems in the task: 0 for an unbounded procedural generator.
  virtual int64_t size() const = 0;
  /// Problem `index`: for a procedural task drawn from (seed, index); for a dataset, line `index`.
  virtual rl_prompt problem(uint64_t seed, int64_t index) const = 0;
  /// The reward of `completion` (the generated text, end marker excluded), in [0, 1].
  virtual double reward(const rl_prompt& p, std::string_view completion) const = 0;
  /// A completion that earns the full reward (what `weft rl --write-sft-data` writes).
  virtual std::string reference_completion(const rl_prompt& p) const { return p.answer; }
};

/// "What is 47 + 38? Answer with the number only.": operands of `digits` digits, `ops` a subset
/// of "+-*". Reward 1 when the last integer in the completion is the answer (GSM8K-style: "47 +
/// 38 = 85" counts).
std::unique_ptr<rl_task> make_arithmetic_task(int digits, std::string ops = "+");

/// "Reverse the string "kqzfa". Answer with the reversed string only.": `length` lowercase
/// letters. Reward 1 when the completion's first line, without spaces and quotes, is the reverse.
std::unique_ptr<rl_task> make_reverse_task(int length);

/// Countdown (TinyZero's task): "Using the numbers 3, 7, 25, make 46 ..." with `count` numbers
/// from 1 to 25 and a target from 1 to 999 that some expression over them reaches. Reward 1 when
/// the last arithmetic expression in the completion (digits, + - * /, parentheses; an "= 46" after
/// it is allowed) uses each given number at most once, no other number, and equals the target.
std::unique_ptr<rl_task> make_countdown_task(int count);

/// `inner` with an answer format (DeepSeek-R1's format reward): the prompt asks for reasoning and
/// then the final answer inside <answer></answer> (a trailing "Answer with ..." sentence of the
/// inner prompt is replaced), and the reward is format_weight when the completion ends with one
/// <answer>...</answer> (only whitespace after it) plus (1 − format_weight) × the inner task's
/// reward of the text inside the tags; a completion without the format earns 0.
std::unique_ptr<rl_task> make_answer_format_task(std::unique_ptr<rl_task> inner,
                                                 double format_weight = 0.1);

/// The value of an arithmetic expression over integers with + - * / and parentheses (division
/// exact in doubles), and the integers it uses; false if it does not parse or divides by zero.
bool eval_expression(std::string_view text, double& value, std::vector<long long>& numbers);

/// How a dataset answer is checked.
enum class answer_match {
  number,    ///< The last number in the completion equals the answer's (as a number).
  exact,     ///< The completion's first line, trimmed, equals the answer.
  contains,  ///< The completion contains the answer.
};
bool parse_answer_match(const std::string& name, answer_match& out);

/// JSON lines {"prompt": string, "answer": string or number}. A bad line is an error naming
/// file:line (the first 20). `need_answer` false (an external reward scores the samples): the
/// answer is optional and passed on as it is.
result<std::unique_ptr<rl_task>> load_prompt_dataset(const std::filesystem::path& path,
                                                     answer_match match, bool need_answer = true);

/// The last integer in `text` (digits, with a minus sign when one directly precedes them and is
/// not itself preceded by a digit: "3-8" ends in 8, "= -5" in −5), if any.
bool last_integer(std::string_view text, long long& out);
/// 1 when the completion's last integer is the prompt's answer, else 0 (the arithmetic and lookup
/// tasks' reward).
double answer_is_last_integer(const rl_prompt& p, std::string_view completion);

/// Training prompts in a deterministic order and a held-out evaluation set.
///
/// Evaluation: the first `eval_size` distinct problems of the evaluation stream (a procedural
/// task: drawn from another seed; a dataset: the last `eval_size` lines). Training: a procedural
/// task draws problem after problem from the training seed, skipping held-out keys; a dataset
/// visits its other lines once per epoch in a permutation drawn from (seed, epoch).
class prompt_source {
 public:
  prompt_source(const rl_task& task, uint64_t seed, int64_t eval_size);

  /// The next training problem; advances the cursor.
  rl_prompt next();
  const std::vector<rl_prompt>& eval_set() const { return eval_; }
  /// Problems handed out so far (the cursor; with the seed it determines all to come).
  int64_t cursor() const { return cursor_; }
  void set_cursor(int64_t c);

 private:
  rl_prompt at(int64_t n);  ///< Training problem number n.

  const rl_task* task_;
  uint64_t seed_;
  std::vector<rl_prompt> eval_;
  std::unordered_set<std::string> held_out_;
  std::vector<int64_t> train_lines_;  ///< A dataset's lines not held out.
  int64_t cursor_ = 0;
  int64_t draw_ = 0;  ///< Procedural: the generator index the next problem is drawn from.
  int64_t perm_epoch_ = -1;
  std::vector<int64_t> perm_;
};

}  // namespace weft::gpu::rl
