#pragma once
/// CAF atoms of the serving protocol (api <-> router <-> engine workers). At most 10 characters.
///
///   api -> router      (submit_atom, GenerateRequest)            -> (ok) or Error envelope
///   api -> router      (abort_atom, AbortRequest)
///   router -> api      (chunk_atom, TokenChunk)                  new tokens / finish, deduplicated
///   router -> worker   (generate_atom, GenerateRequest)
///   router -> worker   (abort_atom, AbortRequest)
///   worker -> router   (hello_atom, WorkerHello)                 once the model is loaded
///   worker -> router   (chunk_atom, TokenChunk)
///   worker -> router   (load_atom, WorkerLoad)                   every load interval
///   anyone -> router   (status_atom) -> JSON text of workers and queues (GET /admin/cluster)
///   worker <-> router  (handoff_atom, KvHandoff)                 disaggregated KV handoff stages
///   worker -> itself   (pulled_atom, pull id)                    a KV pull's transfer ended

#include <caf/atom.hpp>

namespace weft::serve {

using submit_atom = caf::atom_constant<caf::atom("s_submit")>;
using abort_atom = caf::atom_constant<caf::atom("s_abort")>;
using chunk_atom = caf::atom_constant<caf::atom("s_chunk")>;
using generate_atom = caf::atom_constant<caf::atom("s_generate")>;
using hello_atom = caf::atom_constant<caf::atom("s_hello")>;
using load_atom = caf::atom_constant<caf::atom("s_load")>;
using step_atom = caf::atom_constant<caf::atom("s_step")>;
using status_atom = caf::atom_constant<caf::atom("s_status")>;
using tick_atom = caf::atom_constant<caf::atom("s_tick")>;
using stop_atom = caf::atom_constant<caf::atom("s_stop")>;
using handoff_atom = caf::atom_constant<caf::atom("s_handoff")>;
using pulled_atom = caf::atom_constant<caf::atom("s_pulled")>;
// Prefix-cache pool (actors/cache/cache_shard.hpp):
//   worker -> shard    (cache_lookup_atom, CacheLookup)         -> shard replies (cache_reply_atom,
//   CacheLookupReply) worker -> shard    (cache_release_atom, CacheRelease)       staging slots
//   pulled worker -> shard    (cache_publish_atom, CachePublish)       -> shard replies
//   (cache_done_atom, CachePublishDone) shard -> router    (hello_atom, WorkerHello role
//   cacheShard), (cache_load_atom, CacheShardLoad) router -> workers  (shards_atom, names, handles)
//   the live shards, on every change
using cache_lookup_atom = caf::atom_constant<caf::atom("c_lookup")>;
using cache_reply_atom = caf::atom_constant<caf::atom("c_reply")>;
using cache_release_atom = caf::atom_constant<caf::atom("c_release")>;
using cache_publish_atom = caf::atom_constant<caf::atom("c_publish")>;
using cache_done_atom = caf::atom_constant<caf::atom("c_done")>;
using cache_load_atom = caf::atom_constant<caf::atom("c_load")>;
using shards_atom = caf::atom_constant<caf::atom("c_shards")>;
using fetch_timeout_atom = caf::atom_constant<caf::atom("c_fetchto")>;
//   router -> worker   (cache_ckpt_atom, PoolCheckpoint)  publish more segments of a running
//   sequence
using cache_ckpt_atom = caf::atom_constant<caf::atom("c_ckpt")>;
//   router -> shard    (cache_replicate_atom, key, source shard)  copy a hot segment from its home
//   shard -> router    (cache_replicated_atom, key, shard name, ok)
using cache_replicate_atom = caf::atom_constant<caf::atom("c_repl")>;
using cache_replicated_atom = caf::atom_constant<caf::atom("c_repldone")>;

}  // namespace weft::serve
