#pragma once
/// Compute threads and helper threads: how a serving process keeps its network, actor and HTTP
/// threads from preempting the threads that run forward passes.
///
/// A forward pass on the CPU is a fork-join over all cores, ~150 joins a token: a compute thread
/// that loses its core to a helper thread for 50 µs stalls the other compute threads at the next
/// join for as long. With `helper_sched::batch` a process puts its helper threads in SCHED_BATCH
/// (sched(7)): they get the same fair share of the CPU, but a wake-up no longer preempts a running
/// compute thread on the spot — the helper runs when a compute thread yields or blocks (they do
/// at every join they wait long at), or at the next scheduler tick. Compute threads
/// (thread_pool's, and each thread that owns a forward pass) move themselves back to SCHED_OTHER.
/// docs/runtime.md, "Compute threads and helper threads".
#include <string>

namespace weft::gpu::cpu {

enum class helper_sched { normal, batch };

/// Parses "batch" / "normal"; false on anything else.
bool parse_helper_sched(const std::string& text, helper_sched& out);

/// Puts the calling thread, and so every thread it creates afterwards, in the helper class `s`:
/// call it first thing in a process's main thread. A process that starts in SCHED_BATCH (started
/// by a weft process that did this, or by the user) counts as done. Returns an empty string, or
/// why the class could not be set (a real-time or idle policy from outside: kept as it is).
std::string enter_helper_class(helper_sched s);

/// Called by a thread that runs compute: back to SCHED_OTHER if enter_helper_class moved this
/// process's threads to SCHED_BATCH (a policy set from outside, e.g. `chrt`, is left alone).
/// One relaxed load after the first call on a thread.
void enter_compute_class();

}  // namespace weft::gpu::cpu
