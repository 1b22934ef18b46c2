// The `strata` command: one executable, one subcommand per job (README.md, "Using it").
// Each subcommand lives in its own file and registers here; errors that reach this level are
// printed as one clear line and turned into exit code 1 (bad input) or 2 (internal error).
#include <CLI/CLI.hpp>

#include <cstdio>
#include <exception>

#include "core/error.h"
#include "core/log.h"
#include "cli/commands.h"

int main(int argc, char** argv) {
  CLI::App app{"strata: train transformer models whose weights and optimizer state do not fit in GPU memory"};
  app.require_subcommand(1);
  std::string log_level = "info";
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error or off");

  strata::bench::CommandTable commands;
  strata::cli::register_commands(app, commands);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return strata::cli::report_parse_error(app, e, argc, argv);
  }
  return strata::cli::run_selected(app, commands, log_level);
}
