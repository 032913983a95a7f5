#pragma once
/// What the oracle tier's C++ tests share: where the default model is and whether this is CI (where
/// a missing reference is a failure, never a skip).

#include <cstdlib>
#include <string>

namespace weft::testing {

/// True under CI=true (any value but empty, "false" or "0").
inline bool in_ci() {
  const char* ci = std::getenv("CI");
  return ci != nullptr && *ci != '\0' && std::string(ci) != "false" && std::string(ci) != "0";
}

/// $WEFT_MODEL, else $WEFT_CACHE_DIR or ~/.cache/weft: models/SmolLM2-135M-Instruct.Q4_1.gguf
/// (scripts/fetch_model.sh puts it there). The file may not exist.
inline std::string default_model_path() {
  if (const char* m = std::getenv("WEFT_MODEL")) return m;
  std::string base;
  if (const char* c = std::getenv("WEFT_CACHE_DIR")) {
    base = c;
  } else if (const char* h = std::getenv("HOME")) {
    base = std::string{h} + "/.cache/weft";
  }
  return base + "/models/SmolLM2-135M-Instruct.Q4_1.gguf";
}

}  // namespace weft::testing
