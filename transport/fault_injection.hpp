#pragma once
/// A fault-injecting decorator: wraps any engine and drops, delays, fails or corrupts transfers
/// according to a policy, so failure handling is tested without broken hardware.
///
/// Faults apply to put, get, their batches (one fault per batch; corruption hits the first
/// segment), send, recv and collectives; memory, peer and descriptor calls pass through.
///   drop     the transfer is never started and completes with timeout at its deadline
///            (never a silent loss);
///   delay    the transfer starts delay_ms late (its deadline still counts from the call);
///   fail     after the first fail_after_n transfers, every transfer completes with io_error;
///   corrupt  one byte of the destination is flipped after the bytes arrived (put/send: the
///            source byte is flipped while in flight and restored before completion), so a
///            checksum comparison catches it.
/// Randomness comes from `seed`: the same seed and call sequence inject the same faults.
/// Through the registry: make_engine("fault:ucx", cfg) with params "fault.drop_probability",
/// "fault.delay_ms", "fault.fail_after_n", "fault.corrupt_probability", "fault.seed".

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "transport/engine.hpp"

namespace weft::transport {

/// What to inject. The default injects nothing.
struct fault_policy {
  double drop_probability = 0.0;     ///< per transfer, in [0, 1]
  std::uint32_t delay_ms = 0;        ///< added to the start of every transfer
  std::int64_t fail_after_n = -1;    ///< -1: never; n: transfers n+1, n+2, ... fail
  double corrupt_probability = 0.0;  ///< per transfer, in [0, 1]
  std::uint64_t seed = 1;
  /// false: put_batch/get_batch answer `unsupported`, like an engine with single transfers only
  /// (exercises every puller's per-segment fallback, transport::get_all).
  bool batches = true;
  /// Deadline of transfers that set none; must match the wrapped engine's
  /// engine_config::default_timeout_ms (the registry sets it).
  std::uint32_t default_timeout_ms = 30'000;
};

/// Counts of injected faults (monotonic).
struct fault_stats {
  std::uint64_t transfers = 0;
  std::uint64_t dropped = 0;
  std::uint64_t delayed = 0;
  std::uint64_t failed = 0;
  std::uint64_t corrupted = 0;
};

/// Parses "fault.*" params into a policy (other keys are ignored). Bad values -> invalid_argument.
result<fault_policy> parse_fault_policy(const std::map<std::string, std::string>& params);

class fault_injecting_engine;

/// Wraps `inner`. Invalid policy values (probability outside [0,1]) -> invalid_argument.
result<std::unique_ptr<fault_injecting_engine>> make_fault_injecting_engine(
    std::unique_ptr<engine> inner, const fault_policy& policy);

/// The decorator. Same contract as every engine; see the file comment for the faults.
class fault_injecting_engine final : public engine {
 public:
  ~fault_injecting_engine() override;

  /// Replaces the policy for transfers started from now on (e.g. heal a link). Thread-safe.
  status set_policy(const fault_policy& policy);
  /// Counts of injected faults so far. Thread-safe.
  fault_stats stats() const;
  /// The wrapped engine.
  engine& inner() { return *inner_; }

  capabilities caps() const override;
  result<region> register_memory(void* data, std::size_t size_bytes, memory_kind kind) override;
  result<region> allocate_memory(std::size_t size_bytes, memory_kind kind) override;
  status release_memory(const region& r) override;
  result<bytes> describe(const region& r) override;
  result<bytes> local_address() override;
  result<peer_handle> connect(std::span<const std::byte> address) override;
  status disconnect(peer_handle peer) override;
  result<remote_region> import_remote(peer_handle peer,
                                      std::span<const std::byte> descriptor) override;
  status release_remote(remote_region remote) override;
  result<transfer> put(const rma_request& request, completion_fn on_done) override;
  result<transfer> get(const rma_request& request, completion_fn on_done) override;
  result<transfer> put_batch(const rma_batch_request& request, completion_fn on_done) override;
  result<transfer> get_batch(const rma_batch_request& request, completion_fn on_done) override;
  result<transfer> send(const send_request& request, completion_fn on_done) override;
  result<transfer> recv(const recv_request& request, completion_fn on_done) override;
  result<transfer> broadcast(const collective_request& request, completion_fn on_done) override;
  result<transfer> all_reduce(const collective_request& request, completion_fn on_done) override;
  status cancel(const transfer& t) override;
  std::size_t progress() override;
  progress_mode mode() const override;

  /// Prefer make_fault_injecting_engine(), which validates the policy (this clamps it).
  fault_injecting_engine(std::unique_ptr<engine> inner, const fault_policy& policy);

 private:
  bool batches_enabled() const;
  struct impl;
  /// Where a corruption lands: the source (flipped while in flight, restored after) or the
  /// destination (flipped after arrival).
  enum class corrupt_side { source, destination };
  template <class Request>
  result<transfer> forward(const Request& rq,
                           result<transfer> (engine::*start)(const Request&, completion_fn),
                           corrupt_side side, std::pair<std::byte*, std::size_t> bytes,
                           completion_fn on_done);

  std::unique_ptr<engine> inner_;
  std::unique_ptr<impl> impl_;
};

}  // namespace weft::transport
