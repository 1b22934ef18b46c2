// spdlog set-up (see core/log.h).
#include "core/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>

#include <string>

#include "core/error.h"

namespace strata {

void init_logging(const LogOptions& options) {
  auto sink = std::make_shared<spdlog::sinks::stderr_color_sink_mt>();
  auto logger = std::make_shared<spdlog::logger>("strata", std::move(sink));
  logger->set_pattern(fmt::format("[%H:%M:%S.%e] [rank {}/{}] [%^%l%$] %v", options.rank, options.world_size));
  logger->set_level(options.level);
  logger->flush_on(spdlog::level::warn);
  spdlog::set_default_logger(std::move(logger));
}

spdlog::level::level_enum parse_log_level(std::string_view text, std::string_view where) {
  const std::string v(text);
  if (v == "trace") return spdlog::level::trace;
  if (v == "debug") return spdlog::level::debug;
  if (v == "info") return spdlog::level::info;
  if (v == "warn" || v == "warning") return spdlog::level::warn;
  if (v == "error") return spdlog::level::err;
  if (v == "off") return spdlog::level::off;
  throw ConfigError(fmt::format("{}: log level '{}' is not known; use trace, debug, info, warn, error or off",
                                where, v));
}

}  // namespace strata
