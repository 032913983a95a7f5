# weft training messages: the data-parallel trainer group (actors/train/) and the coordinator of a
# `weft train --trainers K` run. Bodies of CAF messages in a weft::schema::envelope.
# Evolution follows Cap'n Proto's rules: add fields at the end with new ordinals, never renumber.
@0x89ada8d503741a58;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("weft::schema::wire");

# Rank -> coordinator, once its model and data are loaded: where its data-plane engine listens.
struct TrainerHello {
  rank @0 :UInt32;
  world @1 :UInt32;
  address @2 :Data;        # the engine's local_address() (UCX worker address)
  nodeId @3 :Text;
  pid @4 :UInt32;
}

# Coordinator -> every rank of a complete group: go. A group is formed from ranks that were never
# part of an earlier group, so the members of a broken group cannot mix with their successors.
struct TrainerGroup {
  generation @0 :UInt16;   # incarnation of the group; tags its all-reduce messages
  addresses @1 :List(Data);  # by rank
  resume @2 :Bool;         # continue from the newest valid checkpoint (a gang restart or --resume)
}

# Rank 0 -> coordinator after every optimizer update.
struct TrainerStep {
  generation @0 :UInt16;
  step @1 :Int64;
  loss @2 :Float64;
  lr @3 :Float64;
  gradNorm @4 :Float64;
  tokens @5 :Int64;        # tokens of the whole step (all ranks)
  seconds @6 :Float64;     # wall time of the step
  checkpointed @7 :Bool;   # a checkpoint of this step was started
  reduceSeconds @8 :Float64;  # of `seconds`, the gradient all-reduce (waiting for peers included)
}

# Rank 0 -> coordinator after a held-out evaluation (--eval-data): every rank evaluated its share
# of the eval examples and the sums went over the group.
struct TrainerEval {
  generation @0 :UInt16;
  step @1 :Int64;          # updates done when it was evaluated
  loss @2 :Float64;        # mean -log p over the eval set's loss tokens
  tokens @3 :Int64;
  examples @4 :Int64;
  seconds @5 :Float64;
}

# Rank -> coordinator at the end: finished (`step` = the last update), stopped on request (with a
# checkpoint), or failed. A failure that a restart cannot fix (bad data, a model that does not
# load) is `fatal`: the run ends instead of restarting the group again and again.
struct TrainerDone {
  generation @0 :UInt16;
  rank @1 :UInt32;
  step @2 :Int64;
  stopped @3 :Bool;
  error @4 :Text;          # empty: no error
  fatal @5 :Bool;
  firstStep @6 :Int64;     # the step the group started from (resumed checkpoint, or 0)
}

# Rank 0 -> coordinator once the group agreed where to start: the step it continues after (0: a
# fresh run), so the driver can rewind its loss curve to it.
struct TrainerStarted {
  generation @0 :UInt16;
  firstStep @1 :Int64;
}

# One micro-batch of an RL update (gpu::train::train_batch with each position's policy inputs):
# sequences packed back to back, `prefix` empty or one entry per sequence (-1: none).
struct TrainBatch {
  tokens @0 :List(Int32);
  targets @1 :List(Int32);
  starts @2 :List(Int64);
  prefix @3 :List(Int64);
  behaviourLogp @4 :List(Float32);  # the policy lists: empty, or one entry per position
  advantage @5 :List(Float32);
  weight @6 :List(Float32);
  sample @7 :List(Int32);
  refLogp @8 :List(Float32);
  routes @9 :List(Int16);     # routing replay: empty, or routeWidth entries per position (a
  routeWidth @10 :UInt32;     # position's experts per MoE layer; -1: the trainer routes it)
}

# RL controller (rank 0) -> rank r of a `weft rl --trainers K` group: one micro-batch of rank r's
# part of an optimizer iteration (`count` messages per rank and iteration; with none to train, one
# message without a batch).
struct TrainerWork {
  generation @0 :UInt16;
  step @1 :Int64;
  iteration @2 :Int64;
  lr @3 :Float64;
  optStep @4 :Int64;
  maxGradNorm @5 :Float64;
  count @6 :UInt32;
  list @7 :UInt32;   # the list (parallel share) of the rank the batch belongs to
  index @8 :UInt32;  # its place in the list
  batch @9 :TrainBatch;
}
