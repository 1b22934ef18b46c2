// What the config leaves to the run (config/config.h): values written "auto" that need the run's
// steps or world (Note [Auto values] in config/config.cc), the batch-size triangle, and the startup
// lines about keys without effect and resolved values.
#include <cstdint>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "core/error.h"
#include "config/config.h"

namespace strata {

// One line for the keys without effect (silent ones, at DeepSpeed's default or what Strata does
// anyway, left out), one for the names translated; each key's reason at debug level.
void log_ignored_keys(const TrainConfig& config) {
  std::vector<std::string> no_effect, translated;
  for (const IgnoredKey& k : config.ignored_keys) {
    if (k.kind == IgnoredKey::Kind::Translated) {
      translated.push_back(fmt::format("{} ({})", k.key_path, k.reason));
      continue;
    }
    spdlog::debug("{}: {}: accepted for DeepSpeed compatibility but has no effect in Strata{}: {}", config.source,
                  k.key_path, k.silent ? " (its value is DeepSpeed's default or what Strata does anyway)" : "",
                  k.reason);
    if (!k.silent) no_effect.push_back(k.key_path);
  }
  if (!translated.empty()) {
    spdlog::info("{}: DeepSpeed's other names and old forms, read as the current ones: {}", config.source,
                 fmt::join(translated, "; "));
  }
  if (!no_effect.empty()) {
    spdlog::warn("{}: accepted for DeepSpeed compatibility, without effect here (Strata does it its own way; "
                 "--log-level debug says how for each): {}",
                 config.source, fmt::join(no_effect, ", "));
  }
}

void resolve_step_autos(TrainConfig& config) {
  SchedulerConfig& s = config.scheduler;
  if (!s.total_num_steps_auto) return;
  s.total_num_steps = config.strata.steps;
  s.total_num_steps_auto = false;
  config.resolved_auto.push_back({"scheduler.params.total_num_steps", std::to_string(s.total_num_steps),
                                  "the run's steps (strata.steps or --steps)"});
  if ((s.type == "WarmupDecayLR" || s.type == "WarmupCosineLR") && s.total_num_steps <= s.warmup_num_steps) {
    throw ConfigError(fmt::format("{}: scheduler.params.total_num_steps \"auto\" is the run's {} steps, which must "
                                  "exceed warmup_num_steps ({}) for {}; train more steps (--steps) or set "
                                  "total_num_steps",
                                  config.source, s.total_num_steps, s.warmup_num_steps, s.type));
  }
}

// DeepSpeed's runtime/config.py, _set_batch_related_parameters and _batch_assertion.
void resolve_batch_sizes(TrainConfig& c, int data_world) {
  STRATA_CHECK(data_world >= 1, "{} data-parallel ranks", data_world);
  const std::int64_t world = data_world;
  const bool tbs_given = c.train_batch_size > 0;
  const auto refuse = [&](std::string_view why) {
    throw ConfigError(fmt::format("{}: train_batch_size {}, train_micro_batch_size_per_gpu {} and "
                                  "gradient_accumulation_steps {} over {} data-parallel rank(s): {}",
                                  c.source, tbs_given ? std::to_string(c.train_batch_size) : std::string("(derived)"),
                                  c.micro_batch_given ? std::to_string(c.micro_batch_size) : std::string("(derived)"),
                                  c.accumulation_given ? std::to_string(c.gradient_accumulation_steps)
                                                       : std::string("(derived)"),
                                  world, why));
  };
  // The micro-batch or the accumulation that makes train_batch_size come out whole.
  const auto divide = [&](std::int64_t per_rank_units, const char* what) -> int {
    if (per_rank_units <= 0 || c.train_batch_size % (world * per_rank_units) != 0) {
      refuse(fmt::format("train_batch_size is not a whole multiple of {} x the data-parallel ranks; fix one of them, or "
                         "drop train_batch_size to derive it",
                         what));
    }
    const std::int64_t v = c.train_batch_size / (world * per_rank_units);
    if (v > (1 << 20)) refuse("the derived value is over 1048576");
    return static_cast<int>(v);
  };
  if (tbs_given && c.micro_batch_given && c.accumulation_given) {
    if (c.train_batch_size != static_cast<std::int64_t>(c.micro_batch_size) * c.gradient_accumulation_steps * world) {
      refuse("train_batch_size must equal micro-batch x accumulation x data-parallel ranks; fix one of them or drop "
             "train_batch_size");
    }
  } else if (tbs_given && c.micro_batch_given) {
    c.gradient_accumulation_steps = divide(c.micro_batch_size, "train_micro_batch_size_per_gpu");
  } else if (tbs_given && c.accumulation_given) {
    c.micro_batch_size = divide(c.gradient_accumulation_steps, "gradient_accumulation_steps");
  } else if (tbs_given) {
    c.gradient_accumulation_steps = 1;
    c.micro_batch_size = divide(1, "1 (the accumulation)");
  } else {
    c.train_batch_size = static_cast<std::int64_t>(c.micro_batch_size) * c.gradient_accumulation_steps * world;
  }
  const std::string from = fmt::format("from the other batch sizes and {} data-parallel rank(s)", world);
  if (c.micro_batch_auto) {
    c.resolved_auto.push_back({"train_micro_batch_size_per_gpu", std::to_string(c.micro_batch_size),
                               c.micro_batch_given || tbs_given ? from : "Strata's default"});
  }
  if (c.accumulation_auto) {
    c.resolved_auto.push_back({"gradient_accumulation_steps", std::to_string(c.gradient_accumulation_steps),
                               tbs_given ? from : "Strata's default"});
  }
  if (c.train_batch_size_auto) c.resolved_auto.push_back({"train_batch_size", std::to_string(c.train_batch_size), from});
}

void log_resolved_auto(const TrainConfig& config) {
  if (config.resolved_auto.empty()) return;
  std::string block = fmt::format("{}: resolved \"auto\" (override any with --set key=value):", config.source);
  for (const ResolvedAuto& a : config.resolved_auto) block += fmt::format("\n  {} = {}  ({})", a.key_path, a.value, a.why);
  spdlog::info("{}", block);
}

}  // namespace strata
