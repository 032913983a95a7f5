#pragma once
/// What one supervised fine-tuning run needs, shared by `weft train` in one process and by every
/// rank of a data-parallel trainer group (actors/train/): the options (with their JSON form, which
/// travels to the ranks in a spawn request), the loop's configuration made from them, and loading
/// the model file, the data and the trainable weights. Plain code: no CAF.

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>

#include <nlohmann/json_fwd.hpp>

#include "gpu/gguf.hpp"
#include "gpu/status.hpp"
#include "gpu/train/sft_data.hpp"
#include "gpu/train/sft_trainer.hpp"
#include "gpu/train/trainable_model.hpp"

namespace weft::gpu::train {

/// The options of a run (the flags of `weft train`, docs/training.md).
struct sft_run_options {
  std::string model_path;  ///< resolved by the caller (the default model is an app decision)
  std::string data_path;
  /// Held-out data in the same format (empty: none), evaluated every `eval_every` updates (0:
  /// before the first and after the last only) — evaluate_loss.
  std::string eval_data_path;
  int64_t eval_every = 0;
  int64_t steps = 100;
  int64_t batch_tokens = 4096;
  int64_t micro_batch_tokens = 1024;
  int64_t max_seq_tokens = 1024;
  double lr = 5e-5;
  int64_t warmup_steps = 0;
  std::string lr_schedule = "cosine";
  double min_lr_ratio = 0.1;
  double weight_decay = 0.0;
  double beta1 = 0.9, beta2 = 0.999, adam_eps = 1e-8;
  double max_grad_norm = 1.0;
  uint64_t seed = 0;
  int threads = 1;  ///< cores to use (plan_threads); the caller resolves "all cores"
  bool recompute = false;
  /// Mixture-of-experts models: the load-balancing loss's coefficient (0: none;
  /// trainable_config::router_aux_loss_coef).
  double router_aux_loss_coef = 0.0;
  /// Where training runs: "cpu" (the host, default), or a device backend such as "cuda" /
  /// "cuda:N" (trainable_model::use_device; the whole step on the device unless
  /// offload_optimizer).
  std::string device = "cpu";
  /// With a device: master weights and AdamW on the host (sft_config::offload_optimizer).
  bool offload_optimizer = false;
  /// Trainer groups: where the gradients are summed — "nccl" (on the GPUs, in place), "ucx"
  /// (through host memory over the transport) or "auto" (nccl when every rank trains
  /// device-resident on a GPU of its own). actors/train/gradient_backend.hpp.
  std::string dist_backend = "auto";
  /// Trainer groups summing through host memory: the gradients are summed in buckets of about
  /// this many MiB while the backward runs (PyTorch DDP's bucket_cap_mb; actors/train/
  /// bucket_reducer.hpp); 0: every tensor at once after the backward. The bits do not depend on it.
  double bucket_mb = 25.0;
  std::string checkpoint_dir;
  int64_t checkpoint_every = 50;
  int keep_checkpoints = 2;
  std::string save_path;
  std::string save_type = "f16";
};

nlohmann::json to_json(const sft_run_options& o);
/// Reads and range-checks options (every field optional; unknown keys are refused by name).
result<sft_run_options> sft_run_options_from_json(const nlohmann::json& j);

/// The loop's configuration; invalid_argument for an unknown schedule name.
result<sft_config> make_sft_config(const sft_run_options& o);

/// The model file, the encoded data and (unless `with_model` is false) the f32 trainable weights.
struct sft_run {
  gguf_file file;
  sft_dataset data;
  sft_dataset eval_data;        ///< eval_data_path's examples (none without it)
  std::unique_ptr<device> dev;  ///< The device of --device other than cpu (outlives model).
  std::unique_ptr<trainable_model<float>> model;
};

/// Opens the device a run's `device` option names ("cuda", "cuda:1"); null for "cpu". Errors
/// name the option and the backend's reason (no GPU, no such index).
result<std::unique_ptr<device>> open_training_device(const std::string& name);

/// The device of one rank of a trainer group: a backend named without an index ("cuda") becomes
/// the rank's own device on its host, BACKEND:(local_rank mod devices), as torchrun's LOCAL_RANK
/// picks a GPU; "cpu", an explicit index ("cuda:1") and a backend without devices stay as given
/// (opening the latter then fails with the backend's reason).
std::string device_for_local_rank(const std::string& device, int local_rank, int devices);

/// Opens the model, encodes the data (a bad line is an error naming file:line) and loads the
/// weights, logging what it loaded. Errors name the file.
result<sft_run> load_sft_run(const sft_run_options& o, bool with_model = true);

/// How a run uses `threads` cores: up to 4 shares of each update computed in parallel (one thread
/// each, trainable_model's parallel forward_backward), and the rest as BLAS threads inside each
/// share. Measured on a 2-vCPU host (gpu_train_bench, SmolLM2): 2 shares of 1 BLAS thread train
/// ~13 % faster than 1 share of 2 BLAS threads (docs/training.md). More shares cost a copy of the
/// activations and gradients each, hence the cap.
struct thread_plan {
  int shares = 1;
  int blas = 1;
};
thread_plan plan_threads(int threads);

/// Sets this process's BLAS threads to plan_threads(o.threads).blas.
void use_threads(const sft_run_options& o);
/// Sets OpenBLAS to plan_threads(threads).blas threads.
void use_threads(int threads);

}  // namespace weft::gpu::train
