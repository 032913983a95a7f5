#pragma once
/// Tool calling for /v1/chat/completions (docs/serving.md, "Tool calling"): the request's `tools`,
/// `tool_choice` and `parallel_tool_calls`; how the tools, past calls and their results are
/// written into the prompt; the grammar that forces a call (tool_choice "required" or a named
/// function, built on the structured-output machinery); and the parser that turns the model's
/// output back into OpenAI `tool_calls`, whole or as a stream. Plain code: no CAF.
///
/// Calls are written in one of three formats (tool_format): the tagged one of Hermes/Qwen-style
/// models (each call a JSON object {"name", "arguments"} inside <tool_call></tool_call>), Llama
/// 3.1's (the whole answer a JSON object {"name", "parameters"}, optionally after <|python_tag|>,
/// several separated by ';') and Mistral's ([TOOL_CALLS] then a JSON array of {"name",
/// "arguments"}). A template that renders tools shows them to the model itself; otherwise weft
/// writes them into the system turn in the tagged format.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "gpu/chat_template.hpp"
#include "gpu/status.hpp"

namespace weft::serve {

struct tool_function {
  std::string name;
  std::string description;
  nlohmann::ordered_json parameters;  ///< JSON Schema of the arguments ({"type": "object"} if none)
};

enum class tool_choice { none, automatic, required, named };

/// How the model writes its calls (docs/serving.md, "Tool calling").
enum class tool_format { tagged, llama3_json, mistral };
/// "hermes" (or "tagged"), "llama3_json", "mistral"; nullopt otherwise.
std::optional<tool_format> parse_tool_format(std::string_view name);
const char* tool_format_name(tool_format f);
/// The format a chat template's family writes calls in (chat_template::tool_call_style()).
tool_format tool_format_of(const gpu::chat_template& tmpl);

struct tool_config {
  std::vector<tool_function> tools;
  tool_choice choice = tool_choice::automatic;
  std::string named;     ///< the function of tool_choice {"type": "function", ...}
  bool parallel = true;  ///< parallel_tool_calls: several calls in one answer
  tool_format format = tool_format::tagged;  ///< the server's (kept by read_tool_config)
  /// Whether the tools are shown to the model and its output parsed for calls.
  bool active() const { return !tools.empty() && choice != tool_choice::none; }
  const tool_function* find(std::string_view name) const;
};

/// One call the model made (OpenAI's tool_calls entry).
struct tool_call {
  int32_t index = 0;  ///< position among the choice's calls (the streaming delta's index)
  std::string id;     ///< "call_..." (unique within the response)
  std::string name;
  std::string arguments;  ///< the arguments object as compact JSON text
};

struct tool_error {
  std::string param;
  std::string message;
};

/// Reads `tools`, `tool_choice` and `parallel_tool_calls` from a chat request body (in its
/// declared key order, so argument schemas generate properties in that order). An absent `tools`
/// leaves `out` inactive; tool_choice "required" or a named function without tools, a function
/// named twice, a named choice that is not among the tools are errors naming the field.
std::optional<tool_error> read_tool_config(const nlohmann::ordered_json& body, tool_config& out);

/// Reads one assistant message's `tool_calls` (at = "messages[i]") into `calls_json`: a JSON array
/// of {"id", "type": "function", "function": {"name", "arguments"}} with each arguments string
/// checked and normalised (chat_message::tool_calls).
std::optional<tool_error> read_message_tool_calls(const nlohmann::ordered_json& calls,
                                                  const std::string& at, std::string& calls_json);

/// Readies a conversation for the chat template. A template that renders tools itself gets the
/// messages as they are (and tools_json); otherwise tool results become user turns
/// (tool_response_text), past calls the text the model writes (tool_call_text), and the tool
/// definitions go into the system turn (add_tools_to_messages).
void prepare_chat_messages(const tool_config& tools, std::vector<gpu::chat_message>& messages,
                           bool template_renders_tools);
/// The tools as the JSON array a template's `tools` variable holds; empty when inactive.
std::string tools_json(const tool_config& tools);

/// One call as the model writes it: <tool_call>\n{"name": ..., "arguments": ...}\n</tool_call>.
std::string tool_call_text(std::string_view name, std::string_view arguments_json);
/// A tool's result as the model reads it (the content of a user turn).
std::string tool_response_text(std::string_view content);

/// Puts the tool definitions and instructions into the conversation's system turn (prepended to
/// the first system message, or a new one first).
void add_tools_to_messages(const tool_config& tools, std::vector<gpu::chat_message>& messages);

/// GBNF that admits only calls, in tools.format: tool_choice "required" — one or more calls (one
/// without parallel_tool_calls) of any tool, arguments per its schema; a named function — one
/// call of it. Null for "auto"/"none". A schema keyword the grammar cannot enforce is an error
/// naming it. (Mistral's forced calls are the JSON array without the [TOOL_CALLS] marker, which
/// is a control token in Mistral's vocabularies; the parser accepts both.)
gpu::result<std::optional<std::string>> tool_call_grammar(const tool_config& tools);

/// Splits the model's output into content and calls as it arrives, in tools.format. Tagged: a
/// <tool_call> block whose JSON is not an object {"name": a listed tool, "arguments": object (or a
/// JSON string of one)} stays in the content as written; whitespace between calls is dropped.
/// Llama 3.1: an answer that starts with '{' or <|python_tag|> is held to the end and becomes
/// calls if it is nothing but calls, else it is content as written. Mistral: content streams until
/// [TOOL_CALLS] (or an answer that starts with "[{"); what follows is held to the end and becomes
/// calls if it is a JSON array (or object) of calls, else content. Nothing the model wrote is
/// lost.
class tool_call_parser {
 public:
  /// `tools` must outlive the parser; call ids are id_prefix + index.
  tool_call_parser(const tool_config& tools, std::string id_prefix);

  struct output {
    std::string content;           ///< content that can be shown now
    std::vector<tool_call> calls;  ///< calls completed by this text
  };
  /// The next piece of the output. Text that may be the start of a tag is held back.
  output feed(std::string_view text);
  /// At the end of the output: whatever was held back (an unfinished block is content).
  output finish();
  /// Calls found so far.
  int calls() const { return n_calls_; }

 private:
  void emit_content(std::string_view text, output& out);
  void close_block(std::string_view body, output& out);
  /// The call `j` stands for, when it is {"name": a listed tool, "arguments"|"parameters":
  /// object or a JSON string of one}.
  std::optional<tool_call> call_of(const nlohmann::ordered_json& j) const;
  // Llama 3.1 and Mistral (tool_call_formats.cpp): the answer is content or ends in calls.
  output feed_whole(std::string_view text);
  output finish_whole();
  /// Held text that opens calls: the calls, or nullopt when it is not all calls.
  std::optional<std::vector<tool_call>> parse_held(std::string_view held) const;
  enum class mode { undecided, content, calls };

  const tool_config& tools_;
  std::string id_prefix_;
  std::string buf_;         ///< unprocessed text
  std::string pending_ws_;  ///< whitespace held until content or a call follows
  bool in_block_ = false;
  int n_calls_ = 0;
  mode mode_ = mode::undecided;
};

/// The whole output at once (tool_call_parser over all of it).
tool_call_parser::output parse_tool_output(std::string_view text, const tool_config& tools,
                                           const std::string& id_prefix);

}  // namespace weft::serve
