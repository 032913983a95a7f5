#pragma once
// The open-loop runner: sends every request at its scheduled time, whatever the server's state.

#include <cstddef>
#include <string>
#include <vector>

#include "apps/loadgen/openai_client.hpp"

namespace weft::apps::loadgen {

/// Parameters of one open-loop run.
struct run_config {
  client_config client;
  size_t max_in_flight = 256;        ///< bound on concurrent requests (threads/connections)
  double progress_interval_s = 5.0;  ///< spdlog info line this often (0 = never)
  std::string progress_label;        ///< prefix of the progress lines
};

/// Runs `requests` open loop: a dispatcher thread sleeps until each request's send time and hands
/// it to an idle worker thread (the pool grows up to max_in_flight). A request due while
/// max_in_flight requests are outstanding is not sent and is recorded as client_overload (never
/// delayed). Blocks until every request has finished; returns one record per request, in the order
/// of `requests`. Thread-safe to call from one thread at a time.
std::vector<request_record> run_open_loop(const run_config& config,
                                          const std::vector<request_spec>& requests);

}  // namespace weft::apps::loadgen
