// Placeholder for `strata bench adam` until its issue lands: it says so and fails, never pretends.
#include "tools/commands.h"

#include "core/error.h"

namespace strata::tools {

void register_bench_adam(CLI::App& bench, CommandTable& table) {
  auto* cmd = bench.add_subcommand("adam", "(not built yet)");
  cmd->allow_extras();
  table[cmd] = []() -> int { throw Error("'strata bench adam' is not built yet in this version of Strata"); };
}

}  // namespace strata::tools
