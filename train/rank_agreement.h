// The ranks of one `strata train` job agree on what they run before the first step.
//
// Note [Ranks agree]: mpirun starts whatever each rank was given; ranks that differ in their config
// (steps, seed, micro-batch, model, stage, data) or their Strata build meet in collectives that do
// not match, and a job hangs after the shorter rank's last step or trains on a silent mix. Right
// after the world communicator exists, every rank reduces a hash of its identity: the config after
// --set and --steps, the batch sizes as resolved, the checkpoint it resumes, its --save-weights and
// --summary-json (given to one rank only, the weights' gather hung) and the binary's build id. Equal everywhere, nothing more happens (two host all-reduces). Otherwise rank 0's identity is
// broadcast and each rank compares it key by key: every rank ends with one message, a differing
// rank naming the keys and both values, rank 0 saying which ranks differ. (A refusal of a path on
// one rank is agreed the same way: see Note [Start-up refusals agreed].)
//
// Note [Start-up refusals agreed]: between the world communicator and the first step every rank
// checks things of its own: its outputs, its data file and validation file, its swap files and
// their locks and free space, its plan, the checkpoint it resumes, rank 0's metrics lock. A rank
// that refused alone and left made the others wait in their next collective: a hang, or a job torn
// down by mpirun with the reason on one rank's stream only. So the start-up is a series of steps,
// each run by every rank with no collective a failing rank could skip, each followed by one
// agreement (agreed_startup_step): two host all-reduces learn whether any rank failed and which
// one, the lowest failing rank broadcasts its message, and every rank throws one
// StartupRefusal carrying "rank R of W refused to start: why". Rank 0 prints it; the others end
// with the same exit code in silence, so the job says it once. A rank that stopped only because
// another rank failed (AnotherRankFailed, core/error.h) yields to a rank with a reason of its own.
#pragma once

#include <exception>
#include <string>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "comm/communicator.h"
#include "config/config.h"
#include "train/trainer.h"

namespace strata::train {

// What must be equal on every rank of the job (see the note).
nlohmann::json rank_identity(const TrainOptions& options, const TrainConfig& cfg);

// Collective over `world`: returns when every rank has the same identity, else throws ConfigError
// on every rank (see the note).
void check_ranks_agree(Communicator& world, const nlohmann::json& identity);

// Every rank's start-up refusal, agreed (see Note [Start-up refusals agreed]); world rank 0 prints it.
class StartupRefusal : public Error {
 public:
  StartupRefusal(const std::string& what, int exit_code, bool printed_here)
      : Error(what), exit_code_(exit_code), printed_here_(printed_here) {}
  int exit_code() const { return exit_code_; }
  bool printed_here() const { return printed_here_; }

 private:
  int exit_code_;
  bool printed_here_;
};

// Collective over `world`: `error` is this rank's failure in a start-up step (null when none).
// Returns when no rank failed; else throws StartupRefusal on every rank (see the note). With one
// rank the error itself is rethrown.
void agree_on_startup(Communicator& world, const std::exception_ptr& error);

// Runs `step` on this rank, then agrees on the outcome with every rank of `world`. `step` must not
// issue a collective that a rank failing earlier in it would skip.
template <class Step>
void agreed_startup_step(Communicator& world, Step&& step) {
  std::exception_ptr error;
  try {
    step();
  } catch (const std::exception&) {
    error = std::current_exception();
  }
  agree_on_startup(world, error);
}

// The GNU build id of the running program in hex ("unknown" without one).
std::string program_build_id();

}  // namespace strata::train
