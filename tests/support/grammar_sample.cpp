// Random outputs that a JSON Schema's grammar admits, one JSON text per line, drawn token by token
// through the grammar's token mask over a small JSON-ish vocabulary (single bytes and a few
// multi-byte tokens, as a BPE vocabulary has):
//   weft_grammar_sample SCHEMA.json N SEED      (exit 2 with the compiler's message if refused)
// tests/oracle/gpu/test_json_schema.py validates every line with Python's jsonschema.
#include <cstdio>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "gpu/grammar.hpp"

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s SCHEMA.json N SEED\n", argv[0]);
    return 2;
  }
  std::ifstream in(argv[1]);
  std::stringstream ss;
  ss << in.rdbuf();
  using namespace weft::gpu::grammar;
  auto gbnf = json_schema_to_gbnf(ss.str());
  if (!gbnf) {
    std::fprintf(stderr, "%s\n", gbnf.error().message().c_str());
    return 2;
  }
  auto g = grammar::parse(*gbnf);
  if (!g) {
    std::fprintf(stderr, "generated grammar refused: %s\n%s\n", g.error().message().c_str(),
                 gbnf->c_str());
    return 1;
  }
  std::vector<std::string> pieces;
  for (int b = 32; b < 127; ++b) pieces.emplace_back(1, static_cast<char>(b));
  for (const char* t : {"\\n",  "\\\"",   "\\u00e9", "\xc3\xa9", "true", "false", "null",
                        "\": ", "\", \"", "name",    "id",       "tags", "0.5",   "-1",
                        "e+3",  "{\"",    "\"}",     "[]",       "{}",   "  ",    "\n"})
    pieces.emplace_back(t);
  const auto eos = static_cast<int32_t>(pieces.size());
  pieces.emplace_back();  // the end token: no bytes
  auto trie = std::make_shared<token_trie>(pieces);
  const int n = std::atoi(argv[2]);
  std::mt19937 rng(static_cast<uint32_t>(std::atoi(argv[3])));
  int done = 0, attempts = 0;
  while (done < n && attempts < n * 20) {
    ++attempts;
    constraint c(*g, trie, {eos});
    std::string out;
    bool ended = false;
    for (int step = 0; step < 600 && !ended; ++step) {
      const auto& allowed = c.allowed();
      std::vector<int32_t> ids;
      for (size_t i = 0; i < allowed.size(); ++i)
        if (allowed[i] != 0) ids.push_back(static_cast<int32_t>(i));
      if (ids.empty()) break;
      int32_t pick = ids[rng() % ids.size()];
      // End as soon as the grammar allows it half of the time; close sooner as outputs grow.
      if (allowed[static_cast<size_t>(eos)] != 0 && (rng() % 2 == 0 || step > 300)) pick = eos;
      if (pick == eos) {
        ended = true;
        break;
      }
      if (!c.accept(pieces[static_cast<size_t>(pick)])) {
        std::fprintf(stderr, "the mask allowed a token the grammar refused\n");
        return 1;
      }
      out += pieces[static_cast<size_t>(pick)];
    }
    if (!ended) continue;  // ran out of steps inside a long string or deep nesting
    std::printf("%s\n", out.c_str());
    ++done;
  }
  if (done < n) {
    std::fprintf(stderr, "only %d of %d outputs ended within the step limit\n", done, n);
    return 1;
  }
  return 0;
}
