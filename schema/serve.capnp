# weft serving messages: requests dispatched by the router to engine workers, the token streams the
# workers send back, worker membership and load. Bodies of CAF messages in a weft::schema::envelope.
# Evolution follows Cap'n Proto's rules: add fields at the end with new ordinals, never renumber.
@0xd3a1f0c8e27b4a61;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("weft::schema::wire");

using Control = import "control.capnp";

struct SamplingParams {
  temperature @0 :Float32;          # <= 0: greedy
  topK @1 :Int32;                   # 0: off
  topP @2 :Float32 = 1.0;
  minP @3 :Float32;
  repetitionPenalty @4 :Float32 = 1.0;
  presencePenalty @5 :Float32;
  frequencyPenalty @6 :Float32;
  seed @7 :UInt64;
  maxTokens @8 :Int32;              # tokens to generate in total (resumed tokens count)
  stopTokens @9 :List(Int32);
  stopStrings @10 :List(Text);
  nLogprobs @11 :Int32;             # top-n alternatives per token (0: none)
  wantLogprobs @12 :Bool;           # report each token's log-probability (with nLogprobs alternatives)
  grammar @13 :Text;                # structured outputs: GBNF the output must match (empty: none)
  pooling @14 :UInt8;               # embeddings: 0 none (generate), 1 mean, 2 last token
  priority @15 :Int32;              # lower runs first under the priority policy (0 otherwise)
  logitBiasTokens @16 :List(Int32); # OpenAI's logit_bias: these tokens' logits get
  logitBiasValues @17 :List(Float32); # these biases (same length, each in [-100, 100])
}

# Router -> worker: run one sequence. A migrated request carries the tokens already generated
# (and streamed) elsewhere: the worker prefills prompt + resumeTokens and continues from there.
struct GenerateRequest {
  requestId @0 :UInt64;             # router-wide id of this sequence (one per choice)
  traceId @1 :Text;                 # the client request's id, in every log line about it
  prompt @2 :List(Int32);
  resumeTokens @3 :List(Int32);
  params @4 :SamplingParams;
  deadlineMs @5 :UInt64;            # unix ms after which the request is abandoned (0: none)
  attempt @6 :UInt32;               # 0 first dispatch, then +1 per migration
  handoff @7 :Bool;                 # disaggregated prefill: after the first new token, offer the
                                    # KV to a decode worker (KvHandoff offered) instead of decoding
  kvSource @8 :Data;                # disaggregated decode: a KvDescriptor envelope's bytes; pull
                                    # the KV of prompt + resumeTokens[:-1] instead of prefilling
  poolPlan @9 :List(PoolSegment);   # prefix-cache pool: the prompt's leading segments, in order
}

# Router -> worker: publish the KV of more segments of a running sequence (its prompt and generated
# tokens, keyed by cache::sequence_segment_keys) to their home shards, so that the sequence
# resumes from the pool if the worker dies (docs/cache_pool.md, "Generated tokens").
struct PoolCheckpoint {
  requestId @0 :UInt64;
  attempt @1 :UInt32;               # the worker ignores a checkpoint of another attempt
  firstSegment @2 :UInt32;          # index of segments[0] among the sequence's segments
  segments @3 :List(PoolSegment);   # key and home of each (read is unused)
}

# The pool directory's answer for one segment of a dispatched prompt (actors/cache/directory.hpp).
struct PoolSegment {
  key @0 :UInt64;                   # segment key (the worker checks it against its own)
  read @1 :Text;                    # shard to look the segment up on (its home or a replica)
  home @2 :Text;                    # shard to publish it to after a prefill
}

struct TokenLogprob {
  token @0 :Int32;
  logprob @1 :Float32;
  top @2 :List(TopLogprob);
}

struct TopLogprob {
  token @0 :Int32;
  logprob @1 :Float32;
}

enum FinishReason {
  none @0;
  stopToken @1;
  stopString @2;
  length @3;
  aborted @4;
  error @5;
}

# Worker -> router: new tokens of one sequence. `position` is the index (among generated tokens,
# resumed ones included) of tokens[0]: the receiver drops what it already has, so duplicates from
# a migration never reach the client.
struct TokenChunk {
  requestId @0 :UInt64;
  attempt @1 :UInt32;
  position @2 :UInt32;
  tokens @3 :List(Int32);
  logprobs @4 :List(TokenLogprob);  # empty unless asked; else one per token
  finish @5 :FinishReason;
  promptTokens @6 :UInt32;
  cachedTokens @7 :UInt32;          # prompt tokens served from the prefix cache
  error @8 :Control.Error;          # set when finish == error
  worker @9 :Text;
  embedding @10 :List(Float32);     # pooled hidden state of an embedding request (with its finish)
}

struct AbortRequest {
  requestId @0 :UInt64;
  reason @1 :Text;
}

enum WorkerRole {
  both @0;
  prefill @1;
  decode @2;
  cacheShard @3;                    # a prefix-cache pool shard (says hello like a worker)
}

# Worker -> router when its model is loaded (and again after every restart).
struct WorkerHello {
  name @0 :Text;
  nodeId @1 :Text;
  pid @2 :UInt32;
  role @3 :WorkerRole;
  model @4 :Text;
  kvBlocksTotal @5 :UInt32;
  blockSize @6 :UInt32;
  maxRunning @7 :UInt32;
  nCtx @8 :UInt32;
  sessionToken @9 :Data;            # HMAC of name + nodeId with the cluster secret
  policy @10 :Text;
  deadlineMs @11 :UInt64;           # the session token's deadline
  segmentTokens @12 :UInt32;        # prefix-cache pool segment size (0: the worker uses no pool)
  kvBytesPerToken @13 :UInt64;      # K+V bytes of one token over all layers (transfer estimates)
  poolKeyModel @14 :Text;           # model id and KV layout the worker hashes pool segment keys
  poolKeyLayout @15 :Text;          # with (the router's directory computes the same keys)
}

# Worker -> router, periodically and on demand: load and progress.
struct WorkerLoad {
  name @0 :Text;
  nWaiting @1 :UInt32;
  nRunning @2 :UInt32;
  nSwapped @3 :UInt32;
  kvBlocksUsed @4 :UInt32;
  kvBlocksFree @5 :UInt32;
  steps @6 :UInt64;                 # forward passes so far: progress
  prefillTokens @7 :UInt64;
  decodeTokens @8 :UInt64;
  preemptions @9 :UInt64;
  queuedPrefillTokens @10 :UInt64;  # prompt tokens not yet computed
  prefillTokensPerS @11 :Float32;   # tokens/s of the interval's passes that prefilled (0: none)
  decodeTokensPerS @12 :Float32;
  swapsOut @13 :UInt64;
  prefixHitTokens @14 :UInt64;
  lastStepUnixMs @15 :UInt64;
  queueDepthPerLevel @16 :List(UInt32);  # live requests per scheduling-policy level (MLFQ queues)
  kvBlocksTotal @17 :UInt32;
  poolHitTokens @18 :UInt64;        # prompt tokens fetched from the prefix-cache pool
  promptTokens @19 :UInt64;         # prompt tokens admitted (hit-rate denominator)
  poolBytesIn @20 :UInt64;          # segment bytes pulled from the pool
  prefixWaits @21 :UInt64;          # requests that waited for another's in-flight prefill of their prefix
  resumePoolTokens @22 :UInt64;     # KV tokens of resumed (migrated) sequences fetched from the pool
  checkpointSegments @23 :UInt64;   # segments of running sequences offered to the pool (PoolCheckpoint)
  # Where the step loop's time went, cumulative seconds: in the engine's step (of which forward
  # passes and sampling), sending its outputs, and between steps (the step message in the mailbox).
  stepSeconds @24 :Float64;
  forwardSeconds @25 :Float64;
  sampleSeconds @26 :Float64;
  outputSeconds @27 :Float64;
  betweenSeconds @28 :Float64;
  # How long its longest step should take (ms; 0: no step measured yet): the router calls the
  # worker hung after some multiple of it without a step (actors/serve/stall_watch.hpp).
  stepBoundMs @29 :UInt32;
}

# Prefill worker -> decode worker (via the router): one sequence's KV blocks, offered under a lease
# for the decode worker to pull over the transport (DistServe disaggregation). The exporter's K and
# V pools are registered once; the bytes of (block i, layer l, K|V) are at
#   regions[K|V] + l * layerStrideBytes + blockIds[i] * blockBytes,  blockBytes long.
# Everything is checked against the importer's own cache; a mismatch is refused, never guessed.
struct KvDescriptor {
  requestId @0 :UInt64;             # router-wide id of the sequence
  modelId @1 :Text;                 # must equal the importer's model id
  layout @2 :Text;                  # kv_layout::describe() of the exporter's cache (dims, block, dtype)
  version @3 :UInt32;               # descriptor format version (1); any other value is refused
  tokens @4 :List(Int32);           # the committed tokens the blocks hold
  engine @5 :Text;                  # transport engine name ("ucx", "inproc"; "fault:" prefix ignored)
  peerAddress @6 :Data;             # the exporter engine's local_address()
  regions @7 :List(KvRegion);       # the exporter's registered pools: [0] = K, [1] = V
  leaseId @8 :UInt64;               # release it on the exporter once the pull ended (either way)
  leaseDeadlineMs @9 :UInt64;       # unix ms; the exporter reclaims the blocks after it
  checksum @10 :UInt64;             # 0: none; else XXH3-64 over XXH3-64(tokens), XXH3-64(range)... (export order)
  weightsVersion @11 :UInt64;       # weights version the KV was computed with; must match
  blockIds @12 :List(UInt32);       # the exporter's block ids, in sequence order
  blockBytes @13 :UInt64;           # bytes of one block of one layer, K or V
  layerStrideBytes @14 :UInt64;     # distance between two layers in a pool
}

# One registered memory region of a KvDescriptor's exporter.
struct KvRegion {
  remoteAddress @0 :UInt64;         # informational (the exporter's address of the region start)
  remoteKey @1 :Data;               # engine::describe() bytes
  sizeBytes @2 :UInt64;
}

# The disaggregated handoff of one sequence's KV, in four messages (all through the router):
#   prefill worker -> router   offered   (descriptor: the KvDescriptor envelope's bytes)
#   decode worker  -> router   pulled | failed (leaseId, bytes, micros; error when failed)
#   router -> prefill worker   release   (leaseId): the owner frees the blocks, exactly once
#   prefill worker -> router   expired   (leaseId): nobody released in time; blocks freed
enum KvHandoffStage {
  offered @0;
  pulled @1;
  failed @2;
  release @3;
  expired @4;
}

struct KvHandoff {
  requestId @0 :UInt64;
  attempt @1 :UInt32;
  stage @2 :KvHandoffStage;
  leaseId @3 :UInt64;
  worker @4 :Text;                  # who sends it
  descriptor @5 :Data;              # offered: KvDescriptor envelope bytes
  bytes @6 :UInt64;                 # pulled: KV bytes moved
  micros @7 :UInt64;                # pulled: transfer time
  error @8 :Control.Error;          # failed
}

# Prefix-cache pool (TokenLake): engine workers <-> cache shards. A segment is the KV of
# segmentTokens prompt tokens, keyed by a chained hash (actors/cache/segment_keys.hpp). Its bytes
# move over the transport (UCX); these messages carry only keys and where to read. Segment bytes
# are laid out per block, per layer, K then V (kv_cache::export_ranges order).

# Worker -> shard: which of these keys do you hold? (keys homed on that shard, in prompt order)
struct CacheLookup {
  requestId @0 :UInt64;
  keys @1 :List(UInt64);
  worker @2 :Text;
}

struct CacheHit {
  key @0 :UInt64;
  offset @1 :UInt64;                # of the segment in the shard's staging region
  sizeBytes @2 :UInt64;
  leaseId @3 :UInt64;               # release it (CacheRelease) once pulled
}

# Shard -> worker: the held keys, copied into leased staging slots the worker pulls from.
struct CacheLookupReply {
  requestId @0 :UInt64;
  shard @1 :Text;
  hits @2 :List(CacheHit);          # a subset of the lookup's keys, in its order
  peerAddress @3 :Data;             # the shard engine's local_address()
  region @4 :Data;                  # describe() of the staging region
  regionBytes @5 :UInt64;
  deadlineMs @6 :UInt64;            # unix ms; staging slots are reclaimed after it
}

struct CacheRelease {
  leaseIds @0 :List(UInt64);
}

struct CachePublishSegment {
  key @0 :UInt64;
  firstBlock @1 :UInt32;            # index in the descriptor's blockIds
  nBlocks @2 :UInt32;
}

# Worker -> shard: store these segments of a sequence the worker offers under a KV lease.
struct CachePublish {
  descriptor @0 :Data;              # a KvDescriptor envelope's bytes
  segments @1 :List(CachePublishSegment);
  worker @2 :Text;
}

# Shard -> worker: the publish ended; release the KV lease.
struct CachePublishDone {
  leaseId @0 :UInt64;
  stored @1 :List(UInt64);
  shard @2 :Text;
  error @3 :Control.Error;
}

# Shard -> router, periodically: occupancy and traffic (metrics, imbalance).
struct CacheShardLoad {
  name @0 :Text;
  nSegments @1 :UInt64;
  bytesUsed @2 :UInt64;
  capacityBytes @3 :UInt64;
  lookups @4 :UInt64;               # keys looked up
  hits @5 :UInt64;                  # keys found
  publishes @6 :UInt64;             # segments stored
  evictions @7 :UInt64;
  bytesIn @8 :UInt64;
  bytesOut @9 :UInt64;
}
