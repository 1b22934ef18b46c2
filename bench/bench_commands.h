// The `strata bench` subcommands. Each bench file registers its own subcommand under the `bench`
// parent that cli/commands.cc creates. The command table's types live here, the lowest floor that
// registers commands, so that bench/ does not include cli/ (cli/commands.h uses these too).
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <map>

namespace strata::bench {

// The function a registered subcommand runs; returns the process exit code.
using CommandFn = std::function<int()>;
// Which function each subcommand runs; owned by main().
using CommandTable = std::map<const CLI::App*, CommandFn>;

// Refuses an empty path given to a flag: `--config "$UNSET"` must not quietly mean "not given"
// (the built-in config, no weights written, no resume). Every command's path flags use it.
const CLI::Validator& non_empty_path();

void register_bench_io(CLI::App& bench, CommandTable& table);
void register_bench_adam(CLI::App& bench, CommandTable& table);
void register_bench_model(CLI::App& bench, CommandTable& table);
void register_bench_step(CLI::App& bench, CommandTable& table);
void register_bench_ckpt(CLI::App& bench, CommandTable& table);

}  // namespace strata::bench
