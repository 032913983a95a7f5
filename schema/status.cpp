#include "schema/status.hpp"

namespace weft {

const char* to_string(errc code) {
  switch (code) {
    case errc::ok:
      return "ok";
    case errc::malformed:
      return "malformed";
    case errc::unauthorized:
      return "unauthorized";
    case errc::not_found:
      return "not_found";
    case errc::timeout:
      return "timeout";
    case errc::unavailable:
      return "unavailable";
    case errc::invalid_argument:
      return "invalid_argument";
    case errc::internal:
      return "internal";
    case errc::already_exists:
      return "already_exists";
    case errc::version_mismatch:
      return "version_mismatch";
    case errc::overloaded:
      return "overloaded";
  }
  return "unknown";
}

std::string error::to_string() const {
  std::string out = weft::to_string(code);
  if (!message.empty()) {
    out += ": ";
    out += message;
  }
  return out;
}

}  // namespace weft
