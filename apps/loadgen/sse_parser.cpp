#include "apps/loadgen/sse_parser.hpp"

namespace weft::apps::loadgen {

void sse_parser::end_line(std::vector<std::string>& events) {
  if (line_.empty()) {  // blank line: dispatch
    if (has_data_) events.push_back(std::move(data_));
    data_.clear();
    has_data_ = false;
    return;
  }
  if (line_.front() != ':') {  // ':' starts a comment
    const auto colon = line_.find(':');
    const std::string_view field = std::string_view{line_}.substr(0, colon);
    std::string_view value;
    if (colon != std::string::npos) {
      value = std::string_view{line_}.substr(colon + 1);
      if (!value.empty() && value.front() == ' ') value.remove_prefix(1);
    }
    if (field == "data") {
      if (has_data_) data_ += '\n';
      data_ += value;
      has_data_ = true;
    }
  }
  line_.clear();
}

std::vector<std::string> sse_parser::feed(std::string_view bytes) {
  std::vector<std::string> events;
  bytes_seen_ += bytes.size();
  for (char c : bytes) {
    if (c == '\n') {
      if (!last_was_cr_) end_line(events);  // "\r\n" ended the line at '\r' already
      last_was_cr_ = false;
    } else if (c == '\r') {
      end_line(events);
      last_was_cr_ = true;
    } else {
      last_was_cr_ = false;
      line_ += c;
    }
  }
  return events;
}

std::vector<std::string> sse_parser::finish() {
  std::vector<std::string> events;
  if (!line_.empty()) end_line(events);
  if (has_data_) events.push_back(std::move(data_));
  data_.clear();
  has_data_ = false;
  return events;
}

}  // namespace weft::apps::loadgen
