// The peer process of the transport integration test. Usage: transport_peer <tls> <size_bytes>
// Prints its address and the descriptors of two regions (a target, zeroed, and a source filled
// with fill_pattern(seed = size)), then serves commands from stdin:
//   sum                -> "sum <xxh3 of the target region>"
//   recv <tag>         -> "posted", then "received <status> <size> <tag> <xxh3 of the bytes>"
//   quit               -> exits 0

#include <cstdlib>
#include <cstring>
#include <sstream>

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "tests/integration/transport/line_protocol.hpp"
#include "transport/checksum.hpp"
#include "transport/registry.hpp"

using namespace weft::transport;
using namespace weft::transport::testing;

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: transport_peer <tls> <size_bytes>\n");
    return 2;
  }
  // stdout carries the protocol: logs go to stderr.
  spdlog::set_default_logger(spdlog::stderr_color_mt("transport_peer"));
  const std::size_t size = std::strtoull(argv[2], nullptr, 10);
  engine_config cfg;
  cfg.params = {{"ucx.tls", argv[1]}};
  auto e = make_engine("ucx", cfg);
  if (!e) {
    std::fprintf(stderr, "peer: %s\n", e.error().to_string().c_str());
    return 1;
  }
  engine& eng = **e;
  auto target = eng.allocate_memory(size);
  auto source = eng.allocate_memory(size);
  if (!target || !source) {
    std::fprintf(stderr, "peer: allocation failed\n");
    return 1;
  }
  std::memset(target->data, 0, size);
  fill_pattern({source->data, size}, size);
  write_line(stdout, "address " + to_hex(*eng.local_address()));
  write_line(stdout, "target " + to_hex(*eng.describe(*target)));
  write_line(stdout, "source " + to_hex(*eng.describe(*source)));

  while (auto line = read_line(stdin)) {
    std::istringstream in(*line);
    std::string cmd;
    in >> cmd;
    if (cmd == "sum") {
      write_line(stdout, "sum " + std::to_string(checksum(target->data, size)));
    } else if (cmd == "recv") {
      tag_t tag = 0;
      in >> tag;
      std::memset(target->data, 0, size);
      auto t = eng.recv(
          {.tag = tag, .local = *target, .size_bytes = size, .options = {.timeout_ms = 30'000}},
          {});
      if (!t) {
        write_line(stdout, "error " + t.error().to_string());
        continue;
      }
      write_line(stdout, "posted");
      completion c = eng.wait(*t);
      write_line(stdout, "received " + std::string(to_string(c.result.code)) + " " +
                             std::to_string(c.size_bytes) + " " + std::to_string(c.tag) + " " +
                             std::to_string(checksum(target->data, c.size_bytes)));
    } else if (cmd == "quit") {
      return 0;
    } else {
      write_line(stdout, "error unknown command");
    }
  }
  return 0;
}
