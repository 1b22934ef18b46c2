// The checkpoint format's pieces shared by the checkpoint files (Note [Checkpoint format] in
// checkpoint/checkpoint.h): range alignment, checksums, step directory names, the manifest's JSON
// (written by checkpoint/checkpoint_writer.cc, parsed and verified in checkpoint/checkpoint_format.cc) and
// typed access to its fields (also used by checkpoint/checkpoint_load.cc). Not part of the public
// interface, which is checkpoint/checkpoint.h.
#pragma once

#include <cstdint>
#include <limits>
#include <type_traits>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "checkpoint/checkpoint.h"
#include "config/json_input.h"

namespace strata::checkpoint_internal {

// Format version 2 starts every range, and ends every file, at a multiple of this (zeros between).
inline constexpr std::uint64_t kRangeAlignBytes = 4096;
inline constexpr const char* kArrayNames[] = {"master", "moment1", "moment2"};

inline std::uint64_t align_to_range(std::uint64_t bytes) {
  return (bytes + kRangeAlignBytes - 1) / kRangeAlignBytes * kRangeAlignBytes;
}

inline std::string hex64(std::uint64_t v) { return fmt::format("{:016x}", v); }

// A file's checksum: XXH64 of its segments' checksums (Note [Checkpoint format] in checkpoint/checkpoint.h).
std::uint64_t file_checksum(const std::vector<std::uint64_t>& segment_sums);

// Whether `name` is a checkpoint directory name ("step-00000120"); sets *step.
bool parse_step_dir(const std::string& name, std::int64_t* step);

// A data file's manifest record (its "files" entry).
nlohmann::json file_record_json(const CheckpointFile& file);

// The manifest of a checkpoint of `engine` after `step` steps whose data files are `files`
// (records from file_record_json, in rank order).
// `groups` (null: the engine's) lists the param groups, as groups_json gives them, of every tensor
// rank with tensor parallelism.
nlohmann::json manifest_json(ZeroEngine& engine, Communicator& world, const TrainConfig& config,
                             const std::string& model_name, std::int64_t step, const nlohmann::json& files,
                             const nlohmann::json& groups = nullptr, const CheckpointTensorParallel& tensor = {});
// The manifest's records of the engine's param groups, each name prefixed with `prefix`.
nlohmann::json groups_json(ZeroEngine& engine, const std::string& prefix = "");

// Typed access to manifest fields with errors naming the file and the field.
class ManifestFields {
 public:
  explicit ManifestFields(std::string path) : path_(std::move(path)) {}
  template <typename T>
  T get(const nlohmann::json& j, const std::string& key, const std::string& where) const {
    const std::string field = where.empty() ? key : where + "." + key;
    if (!j.is_object() || !j.contains(key)) throw error(field, "is missing");
    const nlohmann::json& v = j.at(key);
    if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
      // nlohmann converts 1.5, -1 or 2^40 to an int without complaint; a manifest holds exact integers.
      bool fits = false;
      if (v.is_number_unsigned()) {
        fits = v.get<std::uint64_t>() <= static_cast<std::uint64_t>(std::numeric_limits<T>::max());
      } else if (v.is_number_integer()) {
        if constexpr (std::is_signed_v<T>) {
          fits = v.get<std::int64_t>() >= std::numeric_limits<T>::min() &&
                 v.get<std::int64_t>() <= std::numeric_limits<T>::max();
        }
      }
      if (!fits) throw error(field, fmt::format("is not an integer in range ({})", json_excerpt(v)));
      return v.is_number_unsigned() ? static_cast<T>(v.get<std::uint64_t>()) : static_cast<T>(v.get<std::int64_t>());
    } else {
      try {
        return v.get<T>();
      } catch (const nlohmann::json::exception&) {
        throw error(field, fmt::format("has the wrong type ({})", json_excerpt(v)));
      }
    }
  }
  FormatError error(const std::string& field, const std::string& text) const {
    return FormatError(fmt::format("checkpoint manifest {}: field '{}' {}", path_, field, text));
  }

 private:
  std::string path_;
};

}  // namespace strata::checkpoint_internal
