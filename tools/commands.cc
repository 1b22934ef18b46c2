// Subcommand registry and the top-level error handling of `strata` (see tools/commands.h).
#include "tools/commands.h"

#include <cstdio>
#include <map>

#include <spdlog/spdlog.h>

#include "core/error.h"
#include "core/log.h"

namespace strata::tools {
namespace {
template <typename Register>
void add(CLI::App& app, CommandTable& table, Register reg) {
  CommandFn fn;
  const std::size_t before = app.get_subcommands({}).size();
  reg(app, &fn);
  auto subs = app.get_subcommands({});
  if (subs.size() > before) table[subs.back()] = std::move(fn);
}
}  // namespace

void register_commands(CLI::App& app, CommandTable& table) {
  add(app, table, register_doctor);
}

int run_selected(CLI::App& app, const CommandTable& table, const std::string& log_level) {
  try {
    LogOptions log;
    log.level = parse_log_level(log_level, "--log-level");
    init_logging(log);
    for (CLI::App* sub : app.get_subcommands()) {
      auto it = table.find(sub);
      if (it != table.end() && it->second) return it->second();
    }
    std::fprintf(stderr, "strata: no command selected; see strata --help\n");
    return 1;
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
