#pragma once
/// Where weft keeps files between runs on a host: $WEFT_CACHE_DIR, else ~/.cache/weft (the
/// default model under models/, files received from a trainer group's rank 0 under received/).

#include <cstdlib>
#include <filesystem>

namespace weft::actors {

inline std::filesystem::path weft_cache_dir() {
  if (const char* c = std::getenv("WEFT_CACHE_DIR"); c != nullptr && *c != '\0') return c;
  const char* home = std::getenv("HOME");
  return std::filesystem::path{home != nullptr ? home : "."} / ".cache" / "weft";
}

}  // namespace weft::actors
