# weft RL messages: the rollout agents of a `weft rl --agents N` run (actors/rl/) and the run's
# controller. Bodies of CAF messages in a weft::schema::envelope.
# Evolution follows Cap'n Proto's rules: add fields at the end with new ordinals, never renumber.
@0xc3d2f1a4b5e69788;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("weft::schema::wire");
using Train = import "train.capnp";

# Agent -> controller once its engine is loaded: where its data-plane engine listens, and the
# weight version it holds (-1: the model file's weights, not a version of this run).
struct RolloutAgentHello {
  agent @0 :UInt32;
  address @1 :Data;        # the engine's local_address() (UCX worker address)
  version @2 :Int64;
  pid @3 :UInt32;
  incarnation @4 :UInt64;  # random per start: tells a restarted agent from its predecessor
  error @5 :Text;          # non-empty: the agent could not start (its model, device or engine)
}

# One rollout: a prompt (followed by `replay` tokens generated elsewhere, when it moves from a lost
# agent) and how to sample it.
struct RolloutItem {
  id @0 :UInt64;
  tokens @1 :List(Int32);  # prompt, then the replayed tokens
  replay @2 :UInt32;
  seed @3 :UInt64;
  maxTokens @4 :Int32;     # new tokens, not counting the replayed ones
  greedy @5 :Bool;
  stopTokens @6 :List(Int32);
  # How a sampled (not greedy) rollout draws: logits / temperature, then top-k and top-p filter;
  # the recorded log-probs are of log-softmax(logits / temperature).
  temperature @7 :Float32 = 1.0;
  topP @8 :Float32 = 1.0;
  topK @9 :Int32;
  # Agentic rollouts: finish when the text contains one of these (a tool's closing tag); the
  # text is cut before it. At most 8, each 1 to 64 bytes.
  stopStrings @10 :List(Text);
  # The engine's rank under --trajectory-priority (lower first; 0 otherwise).
  priority @11 :Int32;
}

# Controller -> agent: rollouts to start.
struct RolloutBatch {
  items @0 :List(RolloutItem);
}

# Controller -> agent: rollouts to drop.
struct RolloutAbort {
  ids @0 :List(UInt64);
}

# Tokens of one rollout from one engine step.
struct RolloutTokens {
  id @0 :UInt64;
  tokens @1 :List(Int32);
  logprobs @2 :List(Float32);   # per token
  text @3 :Data;                # bytes of the tokens' text (may end inside a UTF-8 character)
  finish @4 :UInt8;             # gpu::finish_reason: 0 running, 1 stop token, 2 stop string,
                                # 3 length, 4 aborted, 5 error
  stopToken @5 :Int32;          # finish = 1: the stop token (not in tokens) and its log-prob
  stopLogprob @6 :Float32;
  error @7 :Text;
  cachedPromptTokens @8 :UInt32;  # prompt tokens the agent's prefix cache held
  routes @9 :Data;                # finish != 0 with routing replay: each computed position's
                                  # experts, [positions][layers][experts used] (gpu::engine)
}

# Agent -> controller after an engine step: what it produced, with the weight version that
# sampled it.
struct RolloutProgress {
  agent @0 :UInt32;
  version @1 :Int64;
  outputs @2 :List(RolloutTokens);
}

# A tensor inside a weight image: f32 values at a byte offset.
struct WeightTensor {
  name @0 :Text;
  offset @1 :UInt64;
  count @2 :UInt64;
}

# Controller -> agent: weight version `version` is ready to pull from `address`'s region (the f32
# image of every tensor); apply it between two engine steps and acknowledge.
struct WeightOffer {
  version @0 :Int64;       # (the source is the controller's image, or a peer agent's buffer)
  address @1 :Data;        # the source's transport address
  region @2 :Data;         # the image's remote region descriptor
  imageBytes @3 :UInt64;
  checksum @4 :UInt64;     # xxh3-64 of the image
  tensors @5 :List(WeightTensor);
  bucketBytes @6 :UInt64;  # pulled in buckets of this size
  timeoutMs @7 :UInt32;    # the pull's deadline
}

# Agent -> controller: the version is applied (or why not). An agent that applied it keeps the
# pulled image in registered memory until the next version: `address` and `region` let a peer pull
# the same version from it (a restarted agent pulls from a live peer, not from the trainer).
struct WeightAck {
  agent @0 :UInt32;
  version @1 :Int64;
  error @2 :Text;          # empty: applied
  pullSeconds @3 :Float64;
  applySeconds @4 :Float64;
  address @5 :Data;        # the agent's transport address (applied only)
  region @6 :Data;         # its image buffer's descriptor (applied only)
  pulled @7 :Bool;         # true: pulled and verified, not applied yet (the acknowledgement
                           # follows): peers may pull this version from `region` already
}

# Reward workers (`weft rl --reward-workers K`): the user's reward program runs on other nodes.
# Worker -> controller once it runs: which worker it is.
struct RewardWorkerHello {
  worker @0 :UInt32;
  pid @1 :UInt32;
  incarnation @2 :UInt64;  # random per start
}

# One sample to score (bytes: a completion may end inside a UTF-8 character).
struct RewardItem {
  prompt @0 :Data;
  completion @1 :Data;
  answer @2 :Data;
}

# Controller -> worker: samples to score.
struct RewardBatch {
  batch @0 :UInt64;
  items @1 :List(RewardItem);
}

# Worker -> controller: the batch's rewards in order, or why the reward program failed it (an
# answer that is not a reward, naming the sample; a program that kept crashing or hanging).
struct RewardResult {
  batch @0 :UInt64;
  rewards @1 :List(Float64);
  error @2 :Data;  # bytes: the message may quote a completion that ends inside a character
}

# The KL reference on nodes of its own (`weft rl --reference-workers K`): the frozen starting
# weights' log-probs of the samples the run trains on.
# Worker -> controller once its model is loaded (or why it could not be: `error`, not empty).
struct ReferenceHello {
  worker @0 :UInt32;
  pid @1 :UInt32;
  incarnation @2 :UInt64;  # random per start
  error @3 :Text;
}

# Controller -> worker: one packed batch (its policy lists empty) whose targets' log-probs are
# wanted.
struct ReferenceWork {
  id @0 :UInt64;
  batch @1 :Train.TrainBatch;
}

# Worker -> controller: the log-probs of the batch's targets in position order, or why there are
# none.
struct ReferenceResult {
  id @0 :UInt64;
  logp @1 :List(Float32);
  error @2 :Text;
}

# Tool workers (`weft rl --tool-workers K`): the tools of agentic rollouts run on other nodes.
# Worker -> controller once its tools run (or why they could not start: `error`, not empty).
struct ToolWorkerHello {
  worker @0 :UInt32;
  pid @1 :UInt32;
  incarnation @2 :UInt64;  # random per start
  error @3 :Text;
}

# Controller -> worker: one call (bytes: a model's arguments need not be UTF-8).
struct ToolCallMsg {
  id @0 :UInt64;
  tool @1 :Text;
  args @2 :Data;
}

# Worker -> controller: the call's result as the model will read it ("error: ..." from a tool
# that failed).
struct ToolResultMsg {
  id @0 :UInt64;
  text @1 :Data;
}
