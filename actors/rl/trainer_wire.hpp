#pragma once
/// What both sides of `weft rl`'s trainer group do on the wire (actors/rl/remote_trainers.hpp):
/// the gradient sum, rank 0's state to a new group, and micro-batches as Cap'n Proto.

#include <cstdint>
#include <span>

#include "gpu/status.hpp"
#include "gpu/train/sft_trainer.hpp"
#include "gpu/train/trainable_model.hpp"
#include "schema/status.hpp"
#include "schema/train.capnp.h"
#include "transport/device_group.hpp"
#include "transport/peer_group.hpp"

namespace weft::rl {

/// The gradient sum: every tensor, then the scalars (the same calls in the same order on every
/// rank). With `overlapped` (the group's --bucket-mb reducer, which update_iteration ran through
/// the backward), the tensors are its to sum: it is finished, then the scalars are summed.
gpu::status group_sum(transport::peer_group& g, std::span<const std::span<float>> grads,
                      std::span<double> scalars,
                      gpu::train::overlapped_reducer* overlapped = nullptr);

/// The same sum when the group sums on the GPUs: the device's gradient buffers in place over
/// `devices` (NCCL), then the scalars over `g`.
gpu::status device_group_sum(transport::device_group& devices, transport::peer_group& g,
                             std::span<const std::span<float>> grads, std::span<double> scalars);

/// Rank 0's `state` to every rank, as a sum to which the other ranks add −0.0 (x + (−0.0) = x
/// for every x, −0.0 included), in pieces of at most 64 MiB (the group's buffer stays the size
/// of the gradients).
transport::status broadcast_state(transport::peer_group& g,
                                  std::span<const std::span<float>> state);

/// `policy` false: the tokens, targets and sequences only (no policy inputs, no routes).
void write_batch(schema::wire::TrainBatch::Builder b, const gpu::train::train_batch& x,
                 bool policy = true);
/// A batch from the wire, checked so that the trainer can never index out of bounds.
result<gpu::train::train_batch> read_batch(schema::wire::TrainBatch::Reader r, int64_t vocab);

}  // namespace weft::rl
