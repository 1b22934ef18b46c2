// Registration of the `strata` subcommands. Each command file provides a `register_X(parent,
// table)` that adds its CLI11 subcommand under `parent` and puts the function to run into `table`.
#pragma once

#include <CLI/CLI.hpp>

#include <string>

#include "bench/bench_commands.h"  // CommandFn, bench::CommandTable, the `strata bench` subcommands

namespace strata::cli {

void register_commands(CLI::App& app, bench::CommandTable& table);
// A command line CLI11 could not parse, as one line naming the subcommand, the argument and the
// fix: an unknown subcommand or option gets the nearest known one ("did you mean 'train'?"). Help
// and version requests print as CLI11 prints them. Returns the exit code (1 for bad input).
int report_parse_error(CLI::App& app, const CLI::ParseError& error, int argc, const char* const* argv);
// Runs the selected (innermost) subcommand with logging set up; turns errors into one line and
// an exit code: 1 for bad input or a failed check of the environment, 2 for internal errors.
int run_selected(CLI::App& app, const bench::CommandTable& table, const std::string& log_level);

// One per command file (cli/<name>.cc).
void register_doctor(CLI::App& app, bench::CommandTable& table);
void register_train(CLI::App& app, bench::CommandTable& table);
void register_eval(CLI::App& app, bench::CommandTable& table);
void register_generate(CLI::App& app, bench::CommandTable& table);
void register_estimate(CLI::App& app, bench::CommandTable& table);
void register_simulate(CLI::App& app, bench::CommandTable& table);
// `strata data tokenize` (cli/data.cc).
void register_data(CLI::App& app, bench::CommandTable& table);
// Under `strata ckpt` (cli/commands.cc creates the parent; cli/ckpt.cc).
void register_ckpt(CLI::App& ckpt, bench::CommandTable& table);

}  // namespace strata::cli
