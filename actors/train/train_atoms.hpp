#pragma once
/// CAF atoms of the trainer group (actors/train/). At most 10 characters.
///
///   rank -> coordinator    (t_hello_atom, TrainerHello)     model and data loaded; its engine
///   address coordinator -> ranks   (t_group_atom, TrainerGroup)     a complete group: connect and
///   train rank 0 -> coordinator  (t_started_atom, TrainerStarted) the step the group continues
///   after rank 0 -> coordinator  (t_step_atom, TrainerStep)       after every update rank ->
///   coordinator    (t_done_atom, TrainerDone)       finished, stopped, or failed anyone ->
///   coordinator  (t_stop_atom)                    checkpoint and stop (forwarded to ranks) rank
///   thread -> its own actor (t_failed_atom, text)      the step failed: exit abnormally

#include <caf/atom.hpp>

namespace weft::train {

using t_hello_atom = caf::atom_constant<caf::atom("t_hello")>;
using t_group_atom = caf::atom_constant<caf::atom("t_group")>;
using t_started_atom = caf::atom_constant<caf::atom("t_started")>;
using t_step_atom = caf::atom_constant<caf::atom("t_step")>;
using t_eval_atom = caf::atom_constant<caf::atom("t_eval")>;
using t_done_atom = caf::atom_constant<caf::atom("t_done")>;
using t_stop_atom = caf::atom_constant<caf::atom("t_stop")>;
using t_failed_atom = caf::atom_constant<caf::atom("t_failed")>;

}  // namespace weft::train
