// Subcommand registry and the top-level error handling of `strata` (see tools/commands.h).
#include "tools/commands.h"

#include <cstdio>

#include <spdlog/spdlog.h>

#include "core/error.h"
#include "core/log.h"

namespace strata::tools {

void register_commands(CLI::App& app, CommandTable& table) {
  register_train(app, table);
  register_doctor(app, table);
  register_eval(app, table);
  CLI::App* bench = app.add_subcommand("bench", "benchmarks, each beside its same-run yardstick");
  bench->require_subcommand(1);
  register_bench_io(*bench, table);
  register_bench_adam(*bench, table);
  register_bench_model(*bench, table);
  register_bench_step(*bench, table);
  register_bench_ckpt(*bench, table);
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
}  // namespace

int run_selected(CLI::App& app, const CommandTable& table, const std::string& log_level) {
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
  } catch (const InternalError& e) {
    std::fprintf(stderr, "strata: internal error: %s\n", e.what());
    return 2;
  } catch (const Error& e) {
    std::fprintf(stderr, "strata: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "strata: unexpected error: %s\n", e.what());
    return 2;
  }
}

}  // namespace strata::tools
