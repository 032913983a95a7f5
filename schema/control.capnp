# weft control-plane messages: cluster membership, supervision, spawning, status, transfers, errors.
# Every CAF message body in weft is one of these structs, carried in a weft::schema::envelope.
# Evolution follows Cap'n Proto's rules: add fields at the end with new ordinals, never renumber.
@0xcb55bce65dbb038c;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("weft::schema::wire");

# -- errors ------------------------------------------------------------------------------------

enum ErrorCode {
  none @0;
  malformed @1;         # bytes that do not decode, or fields that fail validation
  unauthorized @2;      # peer did not present the cluster secret
  notFound @3;          # unknown actor name, role, node or transfer
  timeout @4;           # a deadline passed
  unavailable @5;       # no live node/worker can take the request
  invalidArgument @6;   # well-formed but unacceptable values
  internal @7;          # a bug or an unexpected failure on the answering side
  alreadyExists @8;     # a name that is taken
  versionMismatch @9;   # protocol or layout versions that do not match
  overloaded @10;       # admission refused: queue full or the SLO cannot be met (retry later)
}

struct Error {
  code @0 :ErrorCode;
  message @1 :Text;
}

# -- nodes and membership ----------------------------------------------------------------------

enum NodeState {
  joining @0;
  alive @1;
  suspect @2;           # missed heartbeats; not yet declared dead
  dead @3;
  leaving @4;
}

struct DeviceInfo {
  kind @0 :Text;        # "cpu", "cuda"
  index @1 :UInt32;
  memoryBytes @2 :UInt64;
  name @3 :Text;
}

struct NodeInfo {
  nodeId @0 :Text;
  pid @1 :UInt32;
  host @2 :Text;
  port @3 :UInt16;      # the port its CAF middleman publishes the node agent on
  roles @4 :List(Text); # roles this node accepts ("worker", "cache", ...); empty = any
  devices @5 :List(DeviceInfo);
  transportAddress @6 :Data;  # the data-plane endpoint address (UCX worker address)
  startedAtMs @7 :UInt64;
  buildVersion @8 :Text;
}

# A node asks the head to join. `proof` = HMAC-SHA256(secret, nonce || nodeId) with the nonce the
# head handed out in its JoinChallenge; the secret itself never crosses the wire.
struct JoinChallenge {
  nonce @0 :Data;
  headId @1 :Text;
  protocolVersion @2 :UInt32;
}

struct JoinRequest {
  node @0 :NodeInfo;
  nonce @1 :Data;
  proof @2 :Data;
  protocolVersion @3 :UInt32;
}

struct JoinReply {
  accepted @0 :Bool;
  error @1 :Error;
  headId @2 :Text;
  heartbeatIntervalMs @3 :UInt32;
  sessionToken @4 :Data;   # presented on every later request from this node
}

struct LeaveNotice {
  nodeId @0 :Text;
  reason @1 :Text;
}

struct Heartbeat {
  nodeId @0 :Text;
  seq @1 :UInt64;
  sentAtMs @2 :UInt64;
  load @3 :Float32;
}

# -- actors: spawn, stop, status -----------------------------------------------------------------

enum ActorState {
  starting @0;
  running @1;
  restarting @2;
  stopped @3;
  failed @4;            # gave up: restart intensity exceeded
}

struct SpawnRequest {
  requestId @0 :UInt64;
  role @1 :Text;         # a role registered in the node agent's role table
  name @2 :Text;         # the registry name of the new actor (unique in the cluster)
  configJson @3 :Text;   # role-specific settings as JSON
  deadlineMs @4 :UInt64; # absolute, ms since the Unix epoch
  sessionToken @5 :Data;
}

struct SpawnReply {
  requestId @0 :UInt64;
  ok @1 :Bool;
  name @2 :Text;
  nodeId @3 :Text;
  error @4 :Error;
}

struct StopRequest {
  requestId @0 :UInt64;
  name @1 :Text;
  reason @2 :Text;
  sessionToken @3 :Data;
  deadlineMs @4 :UInt64;  # the token expires then (ms since the epoch; 0 is refused)
}

struct ActorStatus {
  name @0 :Text;
  role @1 :Text;
  state @2 :ActorState;
  restarts @3 :UInt32;
  nodeId @4 :Text;
}

struct NodeStatus {
  node @0 :NodeInfo;
  state @1 :NodeState;
  actors @2 :List(ActorStatus);
  lastHeartbeatMs @3 :UInt64;
}

struct ClusterStatus {
  headId @0 :Text;
  nodes @1 :List(NodeStatus);
  events @2 :List(ClusterEvent);
}

struct ClusterEvent {
  atMs @0 :UInt64;
  kind @1 :Text;       # "node_joined", "node_down", "actor_restarted", "actor_failed", ...
  subject @2 :Text;    # node id or actor name
  detail @3 :Text;
}

# -- supervision ---------------------------------------------------------------------------------

enum RestartType {
  permanent @0;
  transient @1;
  temporary @2;
}

struct ChildSpec {
  name @0 :Text;
  role @1 :Text;
  configJson @2 :Text;
  restart @3 :RestartType;
}

# Starts a supervisor on the head whose children are placed on live nodes of the cluster.
struct SupervisorSpec {
  name @0 :Text;
  strategy @1 :Text;          # "one_for_one", "one_for_all", "rest_for_one"
  maxRestarts @2 :UInt32;     # restart intensity: at most this many restarts ...
  windowMs @3 :UInt64;        # ... within this window, else the supervisor gives up
  backoffInitialMs @4 :UInt64;
  backoffMaxMs @5 :UInt64;
  children @6 :List(ChildSpec);
  deadlineMs @7 :UInt64;
  sessionToken @8 :Data;
  backoffFirstMs @9 :UInt64;  # delay of the first restart in a row (0: at once)
}

struct SupervisorStatus {
  name @0 :Text;
  strategy @1 :Text;
  state @2 :ActorState;          # running, or failed once the intensity limit was hit
  children @3 :List(ActorStatus);
  restartsInWindow @4 :UInt32;
}

# -- data plane descriptors ----------------------------------------------------------------------

# Describes bytes another actor may read or write through transport/. Carries everything needed to
# refuse a mismatched transfer rather than guess (layout, dtype, version).
struct RegionDescriptor {
  engine @0 :Text;          # "ucx", "inproc", "nccl"
  ownerNodeId @1 :Text;
  peerAddress @2 :Data;     # the owner's transport endpoint address
  remoteAddress @3 :UInt64;
  remoteKey @4 :Data;       # packed rkey
  sizeBytes @5 :UInt64;
}

struct TransferRequest {
  transferId @0 :UInt64;
  source @1 :RegionDescriptor;
  offsetBytes @2 :UInt64;
  sizeBytes @3 :UInt64;
  deadlineMs @4 :UInt64;
  checksum @5 :UInt64;      # xxh64 of the bytes, 0 = not given
  layout @6 :Text;          # e.g. "kv:llama:f16:block16" — a mismatch is refused
  version @7 :UInt64;
}

struct TransferReply {
  transferId @0 :UInt64;
  ok @1 :Bool;
  checksum @2 :UInt64;
  elapsedUs @3 :UInt64;
  error @4 :Error;
}

# -- measurement -----------------------------------------------------------------------------

struct Ping {
  seq @0 :UInt64;
  sentAtNs @1 :UInt64;
  payload @2 :Data;
}

# -- messages of an embedder's own schema ------------------------------------------------------

# A struct from a schema weft does not know (an embedder's own .capnp file), carried in an envelope
# like any weft message. `typeId` is the struct's Cap'n Proto type id; the receiver names the type
# it expects (envelope::read_user<T>) and the body is validated against that type's schema.
struct UserMessage {
  typeId @0 :UInt64;
  body @1 :AnyPointer;
}

# -- transport faults ----------------------------------------------------------------------------

# Sets the faults the data plane of a node injects from now on (`weft chaos --fault xfer:...`);
# the node's transport must be the fault-injecting decorator (`weft node --transport fault:ucx`).
# All zero (and failAfterN -1) heals it. Signed like a spawn request. The node answers with the
# policy it applied, or an Error.
struct TransportFaults {
  dropProbability @0 :Float64;
  delayMs @1 :UInt32;
  corruptProbability @2 :Float64;
  failAfterN @3 :Int64 = -1;
  seed @4 :UInt64;
  deadlineMs @5 :UInt64;
  sessionToken @6 :Data;
}
