#pragma once
/// The data-parallel trainer group of `weft rl --trainers K` (docs/rl.md, "Trainer groups").
/// Rank 0 is the GRPO loop in the `weft rl` process — it owns the weights the rollout agents
/// pull, the KL reference and the run's checkpoints; ranks 1 .. K − 1 (role "rl_trainer") run on
/// trainer nodes under a one-for-all supervisor. For every optimizer iteration rank 0 sends each
/// rank its micro-batches (TrainerWork), every rank runs its forward and backward, the gradients
/// are summed over UCX (transport::peer_group, rank order: the same bits everywhere) and every
/// rank takes the same AdamW step (gpu/rl/grpo_update.hpp).
///
/// Failures: when a rank dies (its node SIGKILLed) or misses the all-reduce's deadline, rank 0's
/// iteration fails before its update; the controller stops what is left of the group, the
/// supervisor restarts every rank, and the new group (the next generation: old messages never
/// match) receives rank 0's weights and AdamW moments before the iteration is repeated with the
/// same inputs — the run continues bit for bit as if nothing had happened. Ranks that were in a
/// group never join another; ranks only obey the controller they said hello to.

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>

#include <caf/actor.hpp>
#include <caf/fwd.hpp>

#include "gpu/rl/grpo.hpp"
#include "gpu/rl/grpo_update.hpp"
#include "gpu/train/optimizer.hpp"
#include "schema/status.hpp"

namespace weft::actors {
class role_registry;
}

namespace weft::rl {

struct rl_trainer_config {
  std::string model_path;
  int rank = 1;
  int world = 2;
  int threads = 1;  ///< cores of the rank (gpu::train::plan_threads: shares and BLAS threads)
  int shares = 1;   ///< parallel shares of the backward: rank 0's, so the sums match
  float temperature = 1.0f;
  gpu::rl::grpo_config grpo;
  gpu::train::adamw_config adamw;
  uint32_t allreduce_timeout_ms = 120'000;
  /// The all-reduce in buckets of about this many MiB during the backward (0: after it).
  double bucket_mb = 25.0;
  /// Where the rank's forward and backward run: "cpu" (the host), or a device by name (cuda,
  /// cuda:N, cpu:0) — the gradients added into host memory, where the group sums them and
  /// AdamW runs (the ZeRO-Offload split); with a device the sum follows the backward (bucket_mb 0).
  std::string device = "cpu";
  /// --dist-backend (remote_trainers_config::dist_backend): with NCCL chosen, the rank trains
  /// device-resident and sums its gradients on its GPU.
  std::string dist_backend = "auto";
  std::string collectives_engine = "nccl";  ///< remote_trainers_config::collectives_engine
  std::string controller_host = "127.0.0.1";
  uint16_t controller_port = 0;

  std::string to_json() const;
  static result<rl_trainer_config> from_json(const std::string& json);
};

/// Registers the "rl_trainer" role.
void add_rl_trainer_role(actors::role_registry& roles);

struct remote_trainers_config {
  int world = 2;  ///< ranks, this process (rank 0) included
  uint32_t allreduce_timeout_ms = 120'000;
  /// The all-reduce in buckets of about this many MiB during the backward (0: after it; the
  /// ranks' rl_trainer_config::bucket_mb must be the same).
  double bucket_mb = 25.0;
  /// How long ready() waits for a complete group (the ranks load the model first).
  uint32_t no_group_timeout_ms = 300'000;
  /// Called about every 100 ms while waiting (e.g. to relaunch dead node processes).
  std::function<void()> on_idle;
  /// Parameters of rank 0's UCX engine (e.g. "ucx.tls" = "tcp" across namespaces).
  std::map<std::string, std::string> transport_params;
  /// --dist-backend: "auto" (sum on the GPUs with NCCL where every rank trains on a GPU of its
  /// own, else in host memory over UCX), "nccl" (that or the group does not form: the run stops)
  /// or "ucx". Every rank's rl_trainer_config::dist_backend is the same.
  std::string dist_backend = "auto";
  /// Rank 0's CUDA ordinal (its --device), or −1: it trains on the host or a CPU device.
  int cuda_device = -1;
  /// The collectives engine of device_group (registry name; tests name a stand-in).
  std::string collectives_engine = "nccl";
};

class remote_trainers final : public gpu::rl::update_group {
 public:
  static result<std::unique_ptr<remote_trainers>> create(caf::actor_system& sys,
                                                         remote_trainers_config cfg);
  ~remote_trainers() override;
  remote_trainers(const remote_trainers&) = delete;
  remote_trainers& operator=(const remote_trainers&) = delete;

  /// The controller actor: publish it for the ranks.
  caf::actor controller() const;
  /// The ranks' supervisor: once it is gone (the group failed more often than it may restart),
  /// ready() fails instead of waiting.
  void watch_supervisor(const caf::actor& supervisor);
  /// JSON: generation, groups_formed, and per rank {rank, state ready|waiting|down, pid}. Any
  /// thread.
  std::string status_json() const;
  /// Stops the controller actor (call it while the actor system lives; the destructor does).
  void shutdown();

  int world() const override;
  gpu::status ready(const gpu::rl::state_source& state) override;
  bool sums_on_device() const override;
  gpu::status start(
      const gpu::rl::iteration_inputs& in,
      std::span<const std::vector<std::vector<gpu::train::train_batch>>> per_rank) override;
  gpu::status reduce(std::span<const std::span<float>> grads, std::span<double> scalars) override;
  bool lost() const override;
  int64_t groups_formed() const override;
  double take_reduce_seconds() override;
  gpu::train::overlapped_reducer* overlap(const gpu::train::trainable_model<float>& model) override;

  struct impl;

 private:
  explicit remote_trainers(std::unique_ptr<impl> d);
  std::unique_ptr<impl> d_;
};

}  // namespace weft::rl
