#pragma once
// Incremental parser of a text/event-stream (Server-Sent Events) body.

#include <string>
#include <string_view>
#include <vector>

namespace weft::apps::loadgen {

/// Splits an SSE byte stream, fed in arbitrary pieces, into the `data` payloads of its events
/// (multi-line data joined with '\n'; comments and other fields ignored; LF, CRLF or CR line ends).
/// Not thread-safe; one parser per stream.
class sse_parser {
 public:
  /// Consumes `bytes` and returns the data of every event completed by them, in order.
  std::vector<std::string> feed(std::string_view bytes);

  /// Ends the stream: returns the data of a last event not followed by a blank line, if any.
  std::vector<std::string> finish();

  /// Bytes fed so far.
  size_t bytes_seen() const { return bytes_seen_; }

 private:
  void end_line(std::vector<std::string>& events);

  std::string line_;
  std::string data_;
  bool has_data_ = false;
  bool last_was_cr_ = false;
  size_t bytes_seen_ = 0;
};

}  // namespace weft::apps::loadgen
