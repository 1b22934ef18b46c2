// Subcommand registry and the top-level error handling of `strata` (see cli/commands.h).
#include "cli/commands.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include "core/error.h"
#include "core/log.h"
#include "config/config_reader.h"
#include "train/rank_agreement.h"

namespace strata::cli {

void register_commands(CLI::App& app, bench::CommandTable& table) {
  register_train(app, table);
  register_doctor(app, table);
  register_eval(app, table);
  register_generate(app, table);
  register_estimate(app, table);
  register_simulate(app, table);
  register_data(app, table);
  CLI::App* bench = app.add_subcommand("bench", "benchmarks, each beside its same-run yardstick");
  bench->require_subcommand(1);
  bench::register_bench_io(*bench, table);
  bench::register_bench_adam(*bench, table);
  bench::register_bench_model(*bench, table);
  bench::register_bench_step(*bench, table);
  bench::register_bench_ckpt(*bench, table);
  CLI::App* ckpt = app.add_subcommand("ckpt", "checkpoint tools: verify, inspect, export");
  ckpt->require_subcommand(1);
  register_ckpt(*ckpt, table);
}

namespace {
// The innermost selected subcommand.
const CLI::App* selected_leaf(const CLI::App& app) {
  const CLI::App* node = &app;
  for (;;) {
    auto subs = node->get_subcommands();
    if (subs.empty()) return node;
    node = subs.front();
  }
}
// "strata train", "strata bench io": the words that select `app`.
std::string command_path(const CLI::App* app) {
  std::string path;
  for (const CLI::App* a = app; a->get_parent() != nullptr; a = a->get_parent()) path = " " + a->get_name() + path;
  return "strata" + path;  // the root's name is argv[0]
}

std::vector<std::string> subcommand_names(const CLI::App* app) {
  std::vector<std::string> names;
  for (const CLI::App* sub : app->get_subcommands([](const CLI::App*) { return true; })) names.push_back(sub->get_name());
  return names;
}

std::vector<std::string> option_names(const CLI::App* app) {
  std::vector<std::string> names;
  for (const CLI::Option* opt : app->get_options()) {
    for (const auto& l : opt->get_lnames()) names.push_back("--" + l);
    for (const auto& s : opt->get_snames()) names.push_back("-" + s);
  }
  return names;
}

// What is wrong with the argument `arg` that `leaf` did not expect, and the fix.
std::string explain_unexpected(const CLI::App* leaf, const std::string& arg) {
  const std::string where = command_path(leaf);
  if (arg.size() > 1 && arg[0] == '-') {
    const std::string flag = arg.substr(0, arg.find('='));
    const std::vector<std::string> known = option_names(leaf);
    const std::string best = nearest_name(flag, known);
    const std::string hint = best.empty() ? fmt::format("its options are {}", fmt::join(known, ", "))
                                          : fmt::format("did you mean '{}'?", best);
    return fmt::format("{}: unknown option '{}'; {} (see {} --help)", where, flag, hint, where);
  }
  const std::vector<std::string> subs = subcommand_names(leaf);
  if (!subs.empty()) {
    const std::string best = nearest_name(arg, subs);
    const std::string hint = best.empty() ? fmt::format("the commands are {}", fmt::join(subs, ", "))
                                          : fmt::format("did you mean '{}'?", best);
    return fmt::format("'{}' is not a command of {}; {}", arg, where, hint);
  }
  return fmt::format("{}: unexpected argument '{}' (see {} --help)", where, arg, where);
}

}  // namespace

int report_parse_error(CLI::App& app, const CLI::ParseError& error, int argc, const char* const* argv) {
  if (error.get_exit_code() == static_cast<int>(CLI::ExitCodes::Success)) return app.exit(error);  // --help
  const CLI::App* leaf = selected_leaf(app);
  // The unexpected argument that comes first on the command line.
  const std::vector<std::string> extras = app.remaining(/*recurse=*/true);
  std::string first;
  for (int i = 1; i < argc && first.empty(); ++i) {
    if (std::find(extras.begin(), extras.end(), argv[i]) != extras.end()) first = argv[i];
  }
  if (first.empty() && !extras.empty()) first = extras.front();
  std::string message;
  if (!first.empty()) {
    message = explain_unexpected(leaf, first);
  } else if (leaf->get_subcommands().empty() && !subcommand_names(leaf).empty() &&
             leaf->get_require_subcommand_min() > 0) {
    message = fmt::format("{}: a command is needed: {} (see {} --help)", command_path(leaf),
                          fmt::join(subcommand_names(leaf), ", "), command_path(leaf));
  } else {
    message = fmt::format("{}: {} (see {} --help)", command_path(leaf), error.what(), command_path(leaf));
  }
  std::fprintf(stderr, "strata: error: %s\n", message.c_str());
  return 1;
}

int run_selected(CLI::App& app, const bench::CommandTable& table, const std::string& log_level) {
  try {
    LogOptions log;
    log.level = parse_log_level(log_level, "--log-level");
    init_logging(log);
    auto it = table.find(selected_leaf(app));
    if (it == table.end() || !it->second) {
      std::fprintf(stderr, "strata: no command selected; see strata --help\n");
      return 1;
    }
    return it->second();
  } catch (const train::StartupRefusal& e) {
    // Every rank has it; one prints it (Note [Start-up refusals agreed] in train/rank_agreement.h).
    if (e.printed_here()) std::fprintf(stderr, "strata: error: %s\n", e.what());
    return e.exit_code();
  } catch (const InternalError& e) {
    std::fprintf(stderr, "strata: internal error: %s\n", e.what());
    return 2;
  } catch (const Error& e) {
    std::fprintf(stderr, "strata: error: %s\n", e.what());
    return 1;
  } catch (const std::filesystem::filesystem_error& e) {
    // A file-system call without a message of its own (a checkpoint directory on a read-only mount,
    // a path too long, a regular file where a directory goes): the path and the cause, exit 1.
    std::fprintf(stderr, "strata: error: %s\n", filesystem_message(e).c_str());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "strata: unexpected error: %s\n", e.what());
    return 2;
  }
}

}  // namespace strata::cli
