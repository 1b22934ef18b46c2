// Registration of the `strata` subcommands. Each command file provides a `register_X(parent,
// table)` that adds its CLI11 subcommand under `parent` and puts the function to run into `table`.
#pragma once

#include <CLI/CLI.hpp>

#include <filesystem>
#include <functional>
#include <map>
#include <string>

namespace strata::tools {

// The function a registered subcommand runs; returns the process exit code.
using CommandFn = std::function<int()>;
// Which function each subcommand runs; owned by main().
using CommandTable = std::map<const CLI::App*, CommandFn>;

void register_commands(CLI::App& app, CommandTable& table);
// A command line CLI11 could not parse, as one line naming the subcommand, the argument and the
// fix: an unknown subcommand or option gets the nearest known one ("did you mean 'train'?"). Help
// and version requests print as CLI11 prints them. Returns the exit code (1 for bad input).
int report_parse_error(CLI::App& app, const CLI::ParseError& error, int argc, const char* const* argv);
// Runs the selected (innermost) subcommand with logging set up; turns errors into one line and
// an exit code: 1 for bad input or a failed check of the environment, 2 for internal errors.
int run_selected(CLI::App& app, const CommandTable& table, const std::string& log_level);

// Refuses an empty path given to a flag: `--config "$UNSET"` must not quietly mean "not given"
// (the built-in config, no weights written, no resume).
const CLI::Validator& non_empty_path();

// A file-system error as one line: the path(s), the cause and the fix.
std::string filesystem_message(const std::filesystem::filesystem_error& e);

// One per command file (tools/<name>.cc).
void register_doctor(CLI::App& app, CommandTable& table);
void register_train(CLI::App& app, CommandTable& table);
void register_eval(CLI::App& app, CommandTable& table);
void register_generate(CLI::App& app, CommandTable& table);
void register_estimate(CLI::App& app, CommandTable& table);
void register_simulate(CLI::App& app, CommandTable& table);
// `strata data tokenize` (tools/data.cc).
void register_data(CLI::App& app, CommandTable& table);
// Under `strata bench` (tools/bench.cc creates the parent).
void register_bench_io(CLI::App& bench, CommandTable& table);
void register_bench_adam(CLI::App& bench, CommandTable& table);
void register_bench_model(CLI::App& bench, CommandTable& table);
void register_bench_step(CLI::App& bench, CommandTable& table);
void register_bench_ckpt(CLI::App& bench, CommandTable& table);
// Under `strata ckpt` (tools/commands.cc creates the parent; tools/ckpt.cc).
void register_ckpt(CLI::App& ckpt, CommandTable& table);

}  // namespace strata::tools
