#pragma once
/// Tool calling for /v1/chat/completions (docs/serving.md, "Tool calling"): the request's `tools`,
/// `tool_choice` and `parallel_tool_calls`; how the tools, past calls and their results are
/// written into the prompt; the grammar that forces a call (tool_choice "required" or a named
/// function, built on the structured-output machinery); and the parser that turns the model's
/// output back into OpenAI `tool_calls`, whole or as a stream. Plain code: no CAF.
///
/// The format the model sees is the tagged one of Hermes/Qwen-style function-calling models: the
/// tool definitions as JSON lines inside <tools></tools> in the system turn, each call a JSON
/// object {"name", "arguments"} inside <tool_call></tool_call>, each result inside
/// <tool_response></tool_response> in a user turn. The model's chat template is not asked to
/// render tools (weft recognises templates rather than running Jinja).

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

struct tool_config {
  std::vector<tool_function> tools;
  tool_choice choice = tool_choice::automatic;
  std::string named;     ///< the function of tool_choice {"type": "function", ...}
  bool parallel = true;  ///< parallel_tool_calls: several calls in one answer
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

/// GBNF that admits only calls: tool_choice "required" — one or more calls (one without
/// parallel_tool_calls) of any tool, arguments per its schema; a named function — one call of it.
/// Null for "auto"/"none". A schema keyword the grammar cannot enforce is an error naming it.
gpu::result<std::optional<std::string>> tool_call_grammar(const tool_config& tools);

/// Splits the model's output into content and calls as it arrives. A <tool_call> block whose JSON
/// is not an object {"name": a listed tool, "arguments": object (or a JSON string of one)} stays in
/// the content as written: nothing the model wrote is lost. Whitespace between calls is dropped.
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

  const tool_config& tools_;
  std::string id_prefix_;
  std::string buf_;         ///< unprocessed text
  std::string pending_ws_;  ///< whitespace held until content or a call follows
  bool in_block_ = false;
  int n_calls_ = 0;
};

/// The whole output at once (tool_call_parser over all of it).
tool_call_parser::output parse_tool_output(std::string_view text, const tool_config& tools,
                                           const std::string& id_prefix);

}  // namespace weft::serve
