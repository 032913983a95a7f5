// weft_tokenize_tool: weft's tokenizer and chat templates on the command line, for the oracle
// test (which compares them with llama.cpp and jinja2) and for debugging.
//
//   weft_tokenize_tool MODEL.gguf [--parse-special] [--no-add-special] [--time] < strings.json
//     Tokenizes a JSON list of strings. Output: {"tokens": [[id, ...], ...], "decoded": [...],
//     "eog": [id, ...]} (decoded with special tokens rendered; eog = end-of-generation ids);
//     --time prints the encode throughput to stderr.
//
//   weft_tokenize_tool MODEL.gguf --chat [--no-generation-prompt] < conversations.json
//     Renders each conversation ([{"role": ..., "content": ...}, ...]) with the model's chat
//     template; prints a JSON list of prompts.
//
//   weft_tokenize_tool MODEL.gguf --vocab-copy OUT.gguf --pre NAME
//     Writes a tensor-less copy of MODEL's metadata with tokenizer.ggml.pre = NAME (to check
//     other pre-tokenizers on a real vocabulary).
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstring>
#include <iostream>
#include <iterator>
#include <string>

#include "gpu/chat_template.hpp"
#include "gpu/gguf.hpp"
#include "gpu/gguf_writer.hpp"
#include "gpu/tokenizer.hpp"

int main(int argc, char** argv) {
  using namespace weft::gpu;
  if (argc < 2) {
    std::cerr << "usage: " << argv[0]
              << " MODEL.gguf [--parse-special] [--no-add-special] < strings.json\n";
    return 2;
  }
  if (argc == 6 && std::strcmp(argv[2], "--vocab-copy") == 0 &&
      std::strcmp(argv[4], "--pre") == 0) {
    auto src = gguf_file::open(argv[1]);
    if (!src.ok()) {
      std::cerr << src.error().to_string() << "\n";
      return 1;
    }
    gguf_writer w;
    for (const auto& [key, value] : src->metadata()) w.set(key, value);
    w.set("tokenizer.ggml.pre", argv[5]);
    if (auto s = w.write_file(argv[3]); !s.ok()) {
      std::cerr << s.to_string() << "\n";
      return 1;
    }
    return 0;
  }
  if (argc >= 3 && std::strcmp(argv[2], "--chat") == 0) {
    const auto prompt = argc >= 4 && std::strcmp(argv[3], "--no-generation-prompt") == 0
                            ? generation_prompt::omit
                            : generation_prompt::add;
    auto file = gguf_file::open(argv[1]);
    if (!file.ok()) {
      std::cerr << file.error().to_string() << "\n";
      return 1;
    }
    auto tmpl = chat_template::from_gguf(*file);
    if (!tmpl.ok()) {
      std::cerr << tmpl.error().to_string() << "\n";
      return 1;
    }
    const std::string input((std::istreambuf_iterator<char>(std::cin)),
                            std::istreambuf_iterator<char>());
    const auto conversations = nlohmann::json::parse(input, nullptr, false);
    if (conversations.is_discarded() || !conversations.is_array()) {
      std::cerr << "stdin must be a JSON array of conversations\n";
      return 2;
    }
    nlohmann::json out = nlohmann::json::array();
    for (const auto& conv : conversations) {
      std::vector<chat_message> messages;
      for (const auto& m : conv)
        messages.push_back({m.at("role").get<std::string>(), m.at("content").get<std::string>()});
      auto text = tmpl->apply(messages, prompt);
      if (!text.ok()) {
        std::cerr << text.error().to_string() << "\n";
        return 1;
      }
      out.push_back(text.value());
    }
    std::cout << out.dump() << "\n";
    return 0;
  }
  auto parse = parse_special::no;
  auto add = add_special::yes;
  bool timing = false;
  for (int i = 2; i < argc; ++i) {
    if (std::strcmp(argv[i], "--parse-special") == 0) {
      parse = parse_special::yes;
    } else if (std::strcmp(argv[i], "--time") == 0) {
      timing = true;
    } else if (std::strcmp(argv[i], "--no-add-special") == 0) {
      add = add_special::no;
    } else {
      std::cerr << "unknown option " << argv[i] << "\n";
      return 2;
    }
  }
  auto file = gguf_file::open(argv[1]);
  if (!file) {
    std::cerr << file.error().to_string() << "\n";
    return 1;
  }
  auto tok = tokenizer::from_gguf(*file);
  if (!tok) {
    std::cerr << tok.error().to_string() << "\n";
    return 1;
  }
  const std::string input((std::istreambuf_iterator<char>(std::cin)),
                          std::istreambuf_iterator<char>());
  const auto texts = nlohmann::json::parse(input, nullptr, false);
  if (texts.is_discarded() || !texts.is_array()) {
    std::cerr << "stdin must be a JSON array of strings\n";
    return 2;
  }
  nlohmann::json out;
  out["tokens"] = nlohmann::json::array();
  out["decoded"] = nlohmann::json::array();
  out["eog"] = std::vector<token_id>(tok->end_of_generation_ids().begin(),
                                     tok->end_of_generation_ids().end());
  double encode_s = 0;
  size_t n_bytes = 0, n_tokens = 0;
  for (const auto& t : texts) {
    const auto text = t.get<std::string>();
    const auto start = std::chrono::steady_clock::now();
    const auto ids = tok->encode(text, add, parse);
    encode_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    n_bytes += text.size();
    n_tokens += ids.size();
    out["tokens"].push_back(ids);
    out["decoded"].push_back(tok->decode(ids, render_special::yes));
  }
  if (timing) {
    std::cerr << "encoded " << n_bytes << " bytes into " << n_tokens << " tokens in "
              << encode_s * 1e3 << " ms (" << static_cast<double>(n_bytes) / encode_s / 1e6
              << " MB/s)\n";
  }
  std::cout << out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  return 0;
}
