#pragma once
/// Tools of agentic rollouts (docs/rl.md, "Agentic rollouts"): the model calls a tool by writing
/// <name>arguments</name> inside its answer; generation stops at the closing tag, the tool runs
/// (a tool actor, actors/rl/tool_actors.hpp, with its latency), its result is appended to the
/// sample as "<result>value</result>" tokens that are context for the rest of the answer but not
/// in the loss, and generation continues on the same agent (the prefix cache keeps the KV of the
/// turn so far). Two built-in tools: `calc` (an arithmetic expression's value) and `lookup` (a
/// deterministic table: every word of 3 to 12 lowercase letters has a value from 1 to 99).
/// Plain functions and classes, no CAF.

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "gpu/rl/json_lines_process.hpp"
#include "gpu/rl/tasks.hpp"
#include "gpu/status.hpp"

namespace weft::gpu::rl {

/// One call: the tool's name ("calc", "lookup") and the text between its tags.
struct tool_call {
  std::string tool;
  std::string args;
};

/// Whether `name` is a built-in tool.
bool is_tool(std::string_view name);
inline constexpr const char* tool_list = "calc, lookup";
/// Whether `name` can name a tool: a lowercase letter, then up to 23 lowercase letters, digits or
/// underscores (it becomes the tags <name></name>).
bool valid_tool_name(std::string_view name);

/// A tool of your own (`--tool-cmd NAME=COMMAND`): a program speaking JSON lines (weft writes
/// {"id": 7, "tool": "search", "args": "..."}, the program answers {"id": 7, "result": "..."}).
struct tool_command {
  std::string name;
  std::string command;
  /// `--tool-url NAME=URL`: `command` is an http:// URL each call is POSTed to
  /// (actors/rl/tool_http.hpp), several at once, instead of a program's stdin.
  bool http = false;
};
/// Parses "NAME=COMMAND"; an error says what is wrong.
result<tool_command> parse_tool_command(std::string_view spec);

/// Parses "calc,lookup" into tool names; an error names one that is neither built in nor in
/// `custom` (the names of the tools of your own).
result<std::vector<std::string>> parse_tools(std::string_view list,
                                             const std::vector<std::string>& custom = {});

/// The closing tags generation stops at: "</calc>", "</lookup>" for the enabled tools.
std::vector<std::string> tool_stop_strings(const std::vector<std::string>& tools);

/// The call a turn ends with: the turn's text, cut before the closing tag (as the engine's stop
/// strings cut it), ends with "<tool>args" for an enabled tool. False when no enabled tool's
/// opening tag is in the text.
bool parse_tool_call(std::string_view turn_text, const std::vector<std::string>& tools,
                     tool_call& out);

/// The calculator: the value of an arithmetic expression (integers, + - * /, parentheses) as an
/// integer when it is one, else with up to 6 decimals; "error: ..." when it does not parse.
std::string calculator(std::string_view expression);
/// The lookup table: the value of `key` (trimmed, quotes removed, lowercased) from 1 to 99; -1
/// for a key that is not 3 to 12 letters.
long long lookup_value(std::string_view key);
/// The lookup tool's answer: the value, or "error: no entry for ...".
std::string lookup(std::string_view key);
/// Runs a call of a built-in tool in this thread.
std::string run_tool(const tool_call& c);

/// What the model sees after a call: "<result>" + result + "</result>".
std::string tool_observation(std::string_view result);
/// The text after the last observation of a transcript (all of it when it has none): what a
/// tool task scores.
std::string_view final_answer_text(std::string_view transcript);

/// A finished call.
struct tool_result {
  uint64_t id = 0;
  std::string text;
};

/// Where the calls of agentic rollouts run. Calls complete asynchronously; the GRPO loop keeps
/// generating the other samples meanwhile.
class tool_backend {
 public:
  virtual ~tool_backend() = default;
  /// Starts call `id` (ids are the caller's, unique while pending).
  virtual status call(uint64_t id, tool_call c) = 0;
  /// Calls finished since the last ready(); with `wait`, blocks until one is finished unless none
  /// is pending.
  virtual std::vector<tool_result> ready(bool wait) = 0;
  /// Calls started and not yet returned by ready().
  virtual int64_t pending() const = 0;
  /// Calls the tools got (every call counted once, retries not).
  virtual int64_t calls() const = 0;
};

/// Runs every call at once in the caller's thread (unit tests and the simulator; `weft rl` runs
/// its tools as actors).
class inline_tools final : public tool_backend {
 public:
  status call(uint64_t id, tool_call c) override;
  std::vector<tool_result> ready(bool wait) override;
  int64_t pending() const override { return static_cast<int64_t>(done_.size()); }
  int64_t calls() const override { return calls_; }

 private:
  std::deque<tool_result> done_;
  int64_t calls_ = 0;
};

/// A tool of your own as a json_lines_process: one call at a time; a program that crashes or hangs
/// is restarted and asked again (`max_restarts` times), after which the call's result is
/// "error: ..." — what the model sees from a tool that failed. A line that is not an answer is an
/// error result too (and a warning naming the call).
class tool_process {
 public:
  tool_process(tool_command cmd, double timeout_s, int max_restarts);
  ~tool_process();
  std::string call(const tool_call& c);
  int64_t restarts() const;

 private:
  struct impl;
  std::unique_ptr<impl> d_;
};

/// `inner` made a tool task: its prompt tells the model how to call `tools` (and still asks for
/// the answer), and its reward is inner's of the text after the last tool result.
std::unique_ptr<rl_task> make_tool_task(std::unique_ptr<rl_task> inner,
                                        std::vector<std::string> tools);

/// "What is the value of "kqzfa" plus the value of "mobrt"?": 1 to `count` random words (drawn
/// per problem) whose values only the lookup tool knows; reward 1 when the last integer of the
/// completion is the sum. Needs the lookup tool (make_tool_task).
std::unique_ptr<rl_task> make_lookup_task(int count);

}  // namespace weft::gpu::rl
