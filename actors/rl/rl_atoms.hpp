#pragma once
/// CAF atoms of `weft rl --agents N` (actors/rl/). At most 10 characters. Bodies: schema/rl.capnp.
///
///   agent -> controller    (r_hello_atom, RolloutAgentHello)  engine loaded: its address
///   controller -> agent    (r_batch_atom, RolloutBatch)       rollouts to start
///   controller -> agent    (r_abort_atom, RolloutAbort)       rollouts to drop
///   agent -> controller    (r_tokens_atom, RolloutProgress)   tokens of an engine step
///   controller -> agent    (r_offer_atom, WeightOffer)        a weight version to pull
///   agent -> controller    (r_ack_atom, WeightAck)            the version is applied (or not)
///   agent thread -> its own actor (r_failed_atom, text)       the loop failed: exit abnormally
///   reward worker -> controller (w_hello_atom, RewardWorkerHello)  its reward program is ready
///   controller -> reward worker (w_batch_atom, RewardBatch)        samples to score
///   reward worker -> controller (w_result_atom, RewardResult)      their rewards, or the error
///   rl trainer controller -> rank (t_work_atom, TrainerWork)    a micro-batch of an iteration
///   reference worker -> controller (rf_hello_atom, ReferenceHello)  its model loaded (or not)
///   controller -> reference worker (rf_work_atom, ReferenceWork)    a batch to compute
///   reference worker -> controller (rf_result_atom, ReferenceResult) its log-probs, or the error
///   tool worker -> controller (tw_hello_atom, ToolWorkerHello)  its tools run (or not)
///   controller -> tool worker (tw_call_atom, ToolCallMsg)        a call of an agentic rollout
///   tool worker -> controller (tw_result_atom, ToolResultMsg)    the call's result
///   local -> rl trainer controller (t_watch_atom, actor)      watch the ranks' supervisor
///   rl loop thread -> tool router (tl_call_atom, id, tool, args)  an agentic rollout's call
///   router -> tool actor       (tl_call_atom, id, args)   the call (actors/rl/tool_actors.hpp)
///   tool actor -> router       (tl_result_atom, id, text) its result, after the tool's latency
///   router -> itself           (tl_tick_atom)             every 200 ms: calls past deadline
///   (the trainer group otherwise speaks actors/train/train_atoms.hpp: t_hello, t_group, t_done)

#include <caf/atom.hpp>

namespace weft::rl {

using r_hello_atom = caf::atom_constant<caf::atom("r_hello")>;
using r_batch_atom = caf::atom_constant<caf::atom("r_batch")>;
using r_abort_atom = caf::atom_constant<caf::atom("r_abort")>;
using r_tokens_atom = caf::atom_constant<caf::atom("r_tokens")>;
using r_offer_atom = caf::atom_constant<caf::atom("r_offer")>;
using r_ack_atom = caf::atom_constant<caf::atom("r_ack")>;
using r_failed_atom = caf::atom_constant<caf::atom("r_failed")>;
using w_hello_atom = caf::atom_constant<caf::atom("w_hello")>;
using w_batch_atom = caf::atom_constant<caf::atom("w_batch")>;
using w_result_atom = caf::atom_constant<caf::atom("w_result")>;
using t_work_atom = caf::atom_constant<caf::atom("t_work")>;
using rf_hello_atom = caf::atom_constant<caf::atom("rf_hello")>;
using rf_work_atom = caf::atom_constant<caf::atom("rf_work")>;
using rf_result_atom = caf::atom_constant<caf::atom("rf_result")>;
using tw_hello_atom = caf::atom_constant<caf::atom("tw_hello")>;
using tw_call_atom = caf::atom_constant<caf::atom("tw_call")>;
using tw_result_atom = caf::atom_constant<caf::atom("tw_result")>;
using t_watch_atom = caf::atom_constant<caf::atom("t_watch")>;
using tl_call_atom = caf::atom_constant<caf::atom("tl_call")>;
using tl_result_atom = caf::atom_constant<caf::atom("tl_result")>;
using tl_tick_atom = caf::atom_constant<caf::atom("tl_tick")>;

}  // namespace weft::rl
