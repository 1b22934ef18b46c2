// The ranks of a job agree before the first step (see train/rank_agreement.h, Note [Ranks agree] in
// train/rank_agreement.h).
#include "train/rank_agreement.h"

#include <elf.h>
#include <link.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <vector>

#include <fmt/format.h>
#include <xxhash.h>

#include "core/error.h"

namespace strata::train {
namespace {

// Every leaf of `j` by its key path ("strata.data.seq_len"), as JSON text.
void flatten(const nlohmann::json& j, const std::string& path, std::map<std::string, std::string>* out) {
  if (j.is_object() && !j.empty()) {
    for (const auto& [key, value] : j.items()) flatten(value, path.empty() ? key : path + "." + key, out);
    return;
  }
  (*out)[path] = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// Whether `value` is the same on every rank (the all-reduce has Max only: min is -max(-x)).
bool same_everywhere(Communicator& world, double value) {
  return world.all_reduce_host(value, ReduceOp::Max) == -world.all_reduce_host(-value, ReduceOp::Max);
}

// What this rank says about its start-up failure, and the exit code it would have ended with
// (cli/commands.h, run_selected).
struct Failure {
  std::string message;
  int exit_code = 1;
};

Failure describe_failure(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const StartupRefusal& e) {
    return {e.what(), e.exit_code()};
  } catch (const InternalError& e) {
    return {fmt::format("internal error: {}", e.what()), 2};
  } catch (const Error& e) {
    return {e.what(), 1};
  } catch (const std::filesystem::filesystem_error& e) {
    return {filesystem_message(e), 1};
  } catch (const std::exception& e) {
    return {fmt::format("unexpected error: {}", e.what()), 2};
  }
}

bool yields(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const AnotherRankFailed&) {
    return true;
  } catch (...) {
    return false;
  }
}

}  // namespace

void agree_on_startup(Communicator& world, const std::exception_ptr& error) {
  const int n = world.world_size();
  if (error) {  // an agreement inside the step already stopped every rank
    try {
      std::rethrow_exception(error);
    } catch (const StartupRefusal&) {
      throw;
    } catch (...) {
    }
  }
  if (n == 1) {
    if (error) std::rethrow_exception(error);
    return;
  }
  // One all-reduce finds the lowest failing rank, preferring a rank with a reason of its own:
  // 2n - rank for those, n - rank for a rank that only saw another fail, 0 for none.
  const int rank = world.rank();
  const double mine = !error ? 0.0 : yields(error) ? n - rank : 2 * n - rank;
  const int top = static_cast<int>(world.all_reduce_host(mine, ReduceOp::Max));
  if (top == 0) return;
  const int failed = static_cast<int>(world.all_reduce_host(error ? 1.0 : 0.0, ReduceOp::Sum));
  const int root = top > n ? 2 * n - top : n - top;
  Failure f;
  if (rank == root) f = describe_failure(error);
  std::uint64_t size = f.message.size();
  std::int32_t code = f.exit_code;
  world.broadcast_host_bytes(&size, sizeof size, root);
  world.broadcast_host_bytes(&code, sizeof code, root);
  f.message.resize(size);
  world.broadcast_host_bytes(f.message.data(), size, root);
  const std::string others = failed > 1 ? fmt::format(" (and {} other rank{})", failed - 1, failed > 2 ? "s" : "") : "";
  throw StartupRefusal(fmt::format("rank {} of {}{} refused to start, so no rank of the job trains: {}", root, n,
                                   others, f.message),
                       code, rank == 0);
}

std::string program_build_id() {
  std::string id;
  dl_iterate_phdr(
      [](dl_phdr_info* info, std::size_t, void* data) -> int {
        auto* out = static_cast<std::string*>(data);
        for (int i = 0; i < info->dlpi_phnum; ++i) {
          const ElfW(Phdr)& ph = info->dlpi_phdr[i];
          if (ph.p_type != PT_NOTE) continue;
          const char* p = reinterpret_cast<const char*>(info->dlpi_addr + ph.p_vaddr);
          const char* end = p + ph.p_memsz;
          while (p + sizeof(ElfW(Nhdr)) <= end) {
            const auto* note = reinterpret_cast<const ElfW(Nhdr)*>(p);
            const char* name = p + sizeof(ElfW(Nhdr));
            const char* desc = name + ((note->n_namesz + 3) & ~3u);
            if (note->n_type == NT_GNU_BUILD_ID && note->n_namesz == 4 && std::memcmp(name, "GNU", 4) == 0) {
              for (std::uint32_t b = 0; b < note->n_descsz; ++b) {
                *out += fmt::format("{:02x}", static_cast<unsigned char>(desc[b]));
              }
              return 1;
            }
            p = desc + ((note->n_descsz + 3) & ~3u);
          }
        }
        return 1;  // the first object is the program itself
      },
      &id);
  return id.empty() ? "unknown" : id;
}

nlohmann::json rank_identity(const TrainOptions& options, const TrainConfig& cfg) {
  nlohmann::json config = cfg.raw;
  if (config.is_object()) config["strata"]["steps"] = cfg.strata.steps;  // --steps
  return {{"config", config},
          {"resolved", {{"train_micro_batch_size_per_gpu", cfg.micro_batch_size},
                        {"gradient_accumulation_steps", cfg.gradient_accumulation_steps}}},
          {"resume", options.resume},
          // Saving gathers the weights on rank 0 through collectives every rank must join.
          {"save_weights", options.save_weights},
          {"summary_json", options.summary_json},
          {"allow_new_data", options.allow_new_data},
          {"strata_build", program_build_id()}};
}

void check_ranks_agree(Communicator& world, const nlohmann::json& identity) {
  if (world.world_size() == 1) return;
  const std::string text = identity.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  const std::uint64_t h = XXH64(text.data(), text.size(), 0);
  const bool high = same_everywhere(world, static_cast<double>(h >> 32));
  const bool low = same_everywhere(world, static_cast<double>(h & 0xffffffffu));
  if (high && low) return;

  // Rank 0's identity to every rank, then each names its own differences.
  std::uint64_t size = text.size();
  world.broadcast_host_bytes(&size, sizeof size, 0);
  std::string root(size, '\0');
  if (world.rank() == 0) root = text;
  world.broadcast_host_bytes(root.data(), root.size(), 0);
  std::map<std::string, std::string> mine, theirs;
  flatten(identity, "", &mine);
  flatten(nlohmann::json::parse(root, nullptr, /*allow_exceptions=*/false), "", &theirs);
  std::vector<std::string> differ;
  for (const auto& [key, value] : mine) {
    const auto it = theirs.find(key);
    const std::string other = it == theirs.end() ? "(absent)" : it->second;
    if (other != value) differ.push_back(fmt::format("{} ({} here, {} on rank 0)", key, value, other));
  }
  for (const auto& [key, value] : theirs) {
    if (!mine.contains(key)) differ.push_back(fmt::format("{} ((absent) here, {} on rank 0)", key, value));
  }
  const int differing = static_cast<int>(world.all_reduce_host(differ.empty() ? 0.0 : 1.0, ReduceOp::Sum));
  if (!differ.empty()) {
    std::string keys;
    for (std::size_t i = 0; i < differ.size() && i < 6; ++i) keys += (i == 0 ? "" : "; ") + differ[i];
    if (differ.size() > 6) keys += fmt::format("; and {} more", differ.size() - 6);
    throw ConfigError(fmt::format("rank {} of {} does not run what rank 0 runs: {}. Every rank of a job must run the "
                                  "same config, --steps, --resume and Strata build: launch them alike",
                                  world.rank(), world.world_size(), keys));
  }
  throw ConfigError(fmt::format("{} of the {} ranks of this job do not run what rank {} runs (their messages name "
                                "the keys); every rank of a job must run the same config, --steps, --resume and "
                                "Strata build: launch them alike",
                                differing, world.world_size(), world.rank()));
}

}  // namespace strata::train
