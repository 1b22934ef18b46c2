// Registration of the `strata` subcommands. Each command file provides a `register_X` that adds
// its CLI11 subcommand and sets the function run when it is selected.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <map>
#include <string>

namespace strata::tools {

// The function a registered subcommand runs; returns the process exit code.
using CommandFn = std::function<int()>;

// Which function each subcommand runs; owned by main().
using CommandTable = std::map<const CLI::App*, CommandFn>;

void register_commands(CLI::App& app, CommandTable& table);
// Runs the selected subcommand with logging set up; turns errors into one line and an exit code.
int run_selected(CLI::App& app, const CommandTable& table, const std::string& log_level);

// One per command file.
void register_doctor(CLI::App& app, CommandFn* run);

}  // namespace strata::tools
