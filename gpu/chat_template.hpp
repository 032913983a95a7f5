#pragma once
/// Chat prompt formats: turns a list of messages into the prompt text a model was trained on.
///
/// The model's own tokenizer.chat_template runs on weft's Jinja engine (gpu/jinja.hpp), as Hugging
/// Face's apply_chat_template runs it; a template file can replace it (from_jinja, `--chat-template
/// FILE`). A template the engine cannot run falls back, with the reason kept, to a format
/// recognised in it and rendered natively: ChatML (incl. a default system prompt written in the
/// template, as SmolLM2's), Llama 3, Llama 2 ([INST] with <<SYS>>), Mistral ([INST] without a
/// system block) and Zephyr — which is also what an explicit format name selects. Immutable; const
/// calls are thread-safe.

#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include "gpu/status.hpp"

namespace weft::gpu {

class gguf_file;
namespace jinja {
class template_text;
}

/// One chat message. Roles: "system", "user", "assistant" (ChatML and Llama 3 accept any role);
/// "tool" for a tool's result when the template renders tools (chat_template::renders_tools).
struct chat_message {
  std::string role;
  std::string content;
  /// An assistant message's calls: a JSON array of OpenAI tool_calls entries ({"id", "type",
  /// "function": {"name", "arguments"}}), or empty. Given to a Jinja template as `tool_calls`.
  std::string tool_calls;
  std::string tool_call_id;  ///< a tool message's call id (`tool_call_id`), or empty

  chat_message() = default;
  chat_message(std::string r, std::string c, std::string calls = {}, std::string id = {})
      : role(std::move(r)),
        content(std::move(c)),
        tool_calls(std::move(calls)),
        tool_call_id(std::move(id)) {}
};

/// The prompt formats weft can render.
enum class chat_format { chatml, llama3, llama2, mistral, zephyr };

/// Name of a format ("chatml", "llama3", "llama2", "mistral", "zephyr").
std::string_view chat_format_name(chat_format f);
/// Parses a format name; nullopt when unknown.
std::optional<chat_format> parse_chat_format(std::string_view name);

/// Whether the prompt ends with the header of an assistant turn.
enum class generation_prompt { add, omit };

/// A recognised chat format plus the details taken from the model's template.
class chat_template {
 public:
  /// Picks the format: `override_name` when given, else by inspecting tokenizer.chat_template.
  /// Fails (not_found / unsupported) when the file has no template or an unrecognised one.
  static result<chat_template> from_gguf(const gguf_file& file,
                                         std::optional<std::string_view> override_name = {});

  /// Recognises the format of a Jinja template source.
  static result<chat_template> detect(std::string_view jinja_source);

  /// Runs `jinja_source` with weft's Jinja engine; `file` (may be null) gives bos_token and
  /// eos_token and whether the tokenizer adds BOS itself (then a BOS the template writes first is
  /// dropped, not doubled). The template must parse and render a probe conversation.
  static result<chat_template> from_jinja(std::string_view jinja_source, const gguf_file* file);

  /// A format by name, without model-specific details.
  static result<chat_template> from_name(std::string_view name);

  explicit chat_template(chat_format format) : format_(format) {}

  chat_format format() const { return format_; }
  /// System prompt inserted when the first message is not a system message (ChatML templates
  /// that hard-code one, e.g. SmolLM2's); not for an empty conversation, as in the template.
  const std::optional<std::string>& default_system_prompt() const { return default_system_; }
  /// Text that ends a turn in the Zephyr format ("</s>" unless the template says otherwise).
  std::string_view end_of_turn() const { return end_of_turn_; }

  /// Whether the prompt comes from the Jinja template (else from the native format).
  bool runs_jinja() const { return jinja_ != nullptr; }
  /// Whether the Jinja template renders tools itself (it reads a `tools` variable): then
  /// apply's `tools_json`, assistant tool_calls and tool messages go to it as they are.
  bool renders_tools() const { return jinja_ != nullptr && renders_tools_; }
  /// How the template's model family writes tool calls, from markers in its source: "mistral"
  /// ([TOOL_CALLS]), "llama3_json" (<|python_tag|>, or Llama 3 headers without <tool_call>), else
  /// "tagged" (Hermes/Qwen's <tool_call> blocks, also what weft asks of models whose template
  /// does not render tools).
  const std::string& tool_call_style() const { return tool_call_style_; }
  /// Why the model's Jinja template is not used (empty when it is, or when a format was named).
  const std::string& jinja_fallback_reason() const { return fallback_reason_; }
  /// "jinja" or the native format's name.
  std::string describe() const;

  /// Renders the prompt. Fails (invalid_argument) on an empty role, and with the template's own
  /// message when it raises (e.g. roles that do not alternate).
  /// `tools_json`: a JSON array of OpenAI tool definitions, given to a template that renders
  /// tools as `tools` (ignored otherwise; empty: none).
  result<std::string> apply(std::span<const chat_message> messages,
                            generation_prompt prompt = generation_prompt::add,
                            std::string_view tools_json = {}) const;

 private:
  chat_format format_;
  std::optional<std::string> default_system_;
  std::string end_of_turn_ = "</s>";
  std::shared_ptr<const jinja::template_text> jinja_;
  std::string bos_text_, eos_text_;  ///< bos_token and eos_token of the template's context
  bool drop_leading_bos_ = false;    ///< the tokenizer adds BOS itself
  bool renders_tools_ = false;       ///< the template reads `tools`
  std::string tool_call_style_ = "tagged";
  std::string fallback_reason_;
};

}  // namespace weft::gpu
