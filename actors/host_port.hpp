#pragma once
/// HOST:PORT addresses as the command line and role configs spell them (no CAF).

#include <cstdint>
#include <cstdlib>
#include <string>
#include <utility>

#include "schema/status.hpp"

namespace weft::actors {

/// Splits "HOST:PORT" at the last colon; the port must be 1..65535. invalid_argument otherwise.
inline result<std::pair<std::string, uint16_t>> parse_host_port(const std::string& s) {
  const auto colon = s.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == s.size()) {
    return make_error(errc::invalid_argument, "expected HOST:PORT, got '" + s + "'");
  }
  char* end = nullptr;
  const long port = std::strtol(s.c_str() + colon + 1, &end, 10);
  if (*end != '\0' || port <= 0 || port > 65535) {
    return make_error(errc::invalid_argument, "bad port in '" + s + "'");
  }
  return std::make_pair(s.substr(0, colon), static_cast<uint16_t>(port));
}

}  // namespace weft::actors
