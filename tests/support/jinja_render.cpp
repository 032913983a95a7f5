// weft_jinja_render: renders Jinja templates with weft's engine (gpu/jinja.hpp), for the jinja2
// oracle (tests/oracle/gpu/test_jinja.py). Reads JSON lines {"template": ..., "context": {...}}
// from stdin and writes one JSON line per input: {"text": ...} or {"error": ...}.
#include <iostream>
#include <string>

#include <nlohmann/json.hpp>

#include "gpu/jinja.hpp"

int main() {
  using weft::gpu::jinja::template_text;
  using weft::gpu::jinja::value;
  std::string line;
  while (std::getline(std::cin, line)) {
    if (line.empty()) continue;
    nlohmann::json out;
    const auto in = value::parse(line, nullptr, false);
    if (in.is_discarded() || !in.contains("template")) {
      out["error"] = "bad input line";
    } else {
      auto t = template_text::parse(in["template"].get<std::string>());
      if (!t) {
        out["error"] = t.error().message();
      } else {
        auto r = t->render(in.value("context", value::object()));
        if (r)
          out["text"] = *r;
        else
          out["error"] = r.error().message();
      }
    }
    std::cout << out.dump() << "\n" << std::flush;
  }
  return 0;
}
