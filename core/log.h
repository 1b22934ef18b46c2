// Logging: spdlog, with the rank in every line. Call init_logging once per process, before any
// other Strata call logs (the `strata` tool does it after it knows its MPI rank).
#pragma once

#include <spdlog/spdlog.h>

#include <string_view>

namespace strata {

struct LogOptions {
  int rank = 0;
  int world_size = 1;
  spdlog::level::level_enum level = spdlog::level::info;
};

// Installs the default logger: "[HH:MM:SS.mmm] [rank R/W] [level] message" on stderr.
void init_logging(const LogOptions& options);

// Parses trace|debug|info|warn|error|off; throws ConfigError naming `where` otherwise.
spdlog::level::level_enum parse_log_level(std::string_view text, std::string_view where);

}  // namespace strata
