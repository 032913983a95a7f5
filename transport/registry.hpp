#pragma once
/// The engine registry: backends register a factory under a name; callers make engines by name.
///
/// Built-in names: "ucx", "inproc", and "nccl" when built with CUDA. Any name may be prefixed
/// with "fault:" ("fault:ucx") to wrap the engine in the fault-injecting decorator, configured
/// by the "fault.*" params (see fault_injection.hpp).

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "transport/engine.hpp"

namespace weft::transport {

/// Makes an engine from a config; returns a status on failure (e.g. no_device for nccl here).
using engine_factory = std::function<result<std::unique_ptr<engine>>(const engine_config&)>;

/// Registers (or replaces) a factory under `name`. Thread-safe.
void register_engine(const std::string& name, engine_factory factory);

/// Names of every registered engine, sorted.
std::vector<std::string> engine_names();

/// Makes the engine registered as `name` ("fault:<name>" wraps it). Unknown name ->
/// invalid_argument listing the known names.
result<std::unique_ptr<engine>> make_engine(const std::string& name,
                                            const engine_config& config = {});

}  // namespace weft::transport
