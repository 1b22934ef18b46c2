// Placeholder for `strata eval` until its issue lands: it says so and fails, never pretends.
#include "tools/commands.h"

#include "core/error.h"

namespace strata::tools {

void register_eval(CLI::App& app, CommandTable& table) {
  auto* cmd = app.add_subcommand("eval", "(not built yet)");
  cmd->allow_extras();
  table[cmd] = []() -> int { throw Error("'strata eval' is not built yet in this version of Strata"); };
}

}  // namespace strata::tools
