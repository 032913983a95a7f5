#pragma once
// The tiny line protocol between the integration test and its peer process: one command or reply
// per line, byte strings in hex. It stands in for the actor messages that carry the same bytes in
// the real system.

#include <cstdio>
#include <optional>
#include <string>

#include "transport/engine.hpp"

namespace weft::transport::testing {

inline std::string to_hex(const bytes& b) {
  static const char* digits = "0123456789abcdef";
  std::string s;
  s.reserve(b.size() * 2);
  for (std::byte x : b) {
    s.push_back(digits[static_cast<unsigned>(x) >> 4]);
    s.push_back(digits[static_cast<unsigned>(x) & 15]);
  }
  return s;
}

inline std::optional<bytes> from_hex(const std::string& s) {
  if (s.size() % 2 != 0) return std::nullopt;
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  bytes b(s.size() / 2);
  for (std::size_t i = 0; i < b.size(); ++i) {
    int hi = nibble(s[2 * i]), lo = nibble(s[2 * i + 1]);
    if (hi < 0 || lo < 0) return std::nullopt;
    b[i] = static_cast<std::byte>(hi * 16 + lo);
  }
  return b;
}

/// Reads one line without the newline; nullopt at EOF.
inline std::optional<std::string> read_line(std::FILE* f) {
  std::string line;
  int c;
  while ((c = std::fgetc(f)) != EOF) {
    if (c == '\n') return line;
    line.push_back(static_cast<char>(c));
  }
  if (line.empty()) return std::nullopt;
  return line;
}

inline void write_line(std::FILE* f, const std::string& line) {
  std::fputs(line.c_str(), f);
  std::fputc('\n', f);
  std::fflush(f);
}

}  // namespace weft::transport::testing
