#include "transport/status.hpp"

namespace weft::transport {

const char* to_string(status_code code) {
  switch (code) {
    case status_code::ok:
      return "ok";
    case status_code::timeout:
      return "timeout";
    case status_code::canceled:
      return "canceled";
    case status_code::io_error:
      return "io_error";
    case status_code::invalid_argument:
      return "invalid_argument";
    case status_code::peer_unreachable:
      return "peer_unreachable";
    case status_code::corrupt:
      return "corrupt";
    case status_code::unsupported:
      return "unsupported";
    case status_code::no_device:
      return "no_device";
    case status_code::no_memory:
      return "no_memory";
    case status_code::busy:
      return "busy";
    case status_code::internal:
      return "internal";
  }
  return "unknown";
}

std::string status::to_string() const {
  std::string out = transport::to_string(code);
  if (!message.empty()) {
    out += ": ";
    out += message;
  }
  return out;
}

}  // namespace weft::transport
