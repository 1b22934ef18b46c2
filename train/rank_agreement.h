// The ranks of one `strata train` job agree on what they run before the first step.
//
// Note [Ranks agree]: mpirun starts whatever each rank was given; ranks that differ in their config
// (steps, seed, micro-batch, model, stage, data) or their Strata build meet in collectives that do
// not match, and a job hangs after the shorter rank's last step or trains on a silent mix. Right
// after the world communicator exists, every rank reduces a hash of its identity: the config after
// --set and --steps, the batch sizes as resolved, the checkpoint it resumes and the binary's build
// id. Equal everywhere, nothing more happens (two host all-reduces). Otherwise rank 0's identity is
// broadcast and each rank compares it key by key: every rank ends with one message, a differing
// rank naming the keys and both values, rank 0 saying which ranks differ. (A refusal of a path on
// one rank is agreed the same way: another_rank_failed, comm/communicator.h.)
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "comm/communicator.h"
#include "config/config.h"
#include "train/trainer.h"

namespace strata::tools {

// What must be equal on every rank of the job (see the note).
nlohmann::json rank_identity(const TrainOptions& options, const TrainConfig& cfg);

// Collective over `world`: returns when every rank has the same identity, else throws ConfigError
// on every rank (see the note).
void check_ranks_agree(Communicator& world, const nlohmann::json& identity);

// The GNU build id of the running program in hex ("unknown" without one).
std::string program_build_id();

}  // namespace strata::tools
