// The checkpoint format (Note [Checkpoint format] in checkpoint/checkpoint.h): the manifest's JSON as
// written and as parsed (every field checked, errors naming the manifest and the field), the
// `latest` pointer, the XXH64 checksums, and CheckpointReader, which verifies data files against
// the manifest and reads ranges of the saved state out of them (versions 1 and 2).
#include "checkpoint/checkpoint_format.h"

#include <algorithm>
#include <optional>
#include <bit>
#include <cerrno>
#include <filesystem>
#include <memory>
#include <optional>
#include <utility>

#include <xxhash.h>

#include "core/file_io.h"
#include "config/json_input.h"
#include "plan/partition.h"

namespace strata {

static_assert(std::endian::native == std::endian::little, "checkpoint files are little-endian fp32");

namespace fs = std::filesystem;
using namespace checkpoint_internal;

namespace checkpoint_internal {

std::uint64_t file_checksum(const std::vector<std::uint64_t>& segment_sums) {
  return XXH64(segment_sums.data(), segment_sums.size() * sizeof(std::uint64_t), 0);
}

bool parse_step_dir(const std::string& name, std::int64_t* step) {
  if (name.rfind("step-", 0) != 0 || name.size() <= 5) return false;
  const std::string digits = name.substr(5);
  if (!std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) return false;
  if (digits.size() > 18) return false;  // past any step count, and past what stoll takes
  *step = std::stoll(digits);
  return true;
}

nlohmann::json file_record_json(const CheckpointFile& file) {
  nlohmann::json ranges = nlohmann::json::array();
  for (const CheckpointRange& r : file.ranges) {
    nlohmann::json hashes = nlohmann::json::array();
    for (const std::uint64_t h : r.xxh64) hashes.push_back(hex64(h));
    ranges.push_back({{"group", r.group},
                      {"offset_elems", r.offset_elems},
                      {"elems", r.elems},
                      {"file_offset_bytes", r.file_offset_bytes},
                      {"xxh64", hashes}});
  }
  return {{"name", file.name},
          {"rank", file.rank},
          {"bytes", file.bytes},
          {"xxh64", hex64(file.xxh64)},
          {"ranges", ranges}};
}

nlohmann::json groups_json(ZeroEngine& engine, const std::string& prefix) {
  nlohmann::json groups = nlohmann::json::array();
  const auto specs = engine.groups();
  for (std::size_t g = 0; g < specs.size(); ++g) {
    const GroupLayout layout(specs[g], 1);  // tensor offsets do not depend on the shard count
    nlohmann::json tensors = nlohmann::json::array();
    for (std::size_t t = 0; t < specs[g].tensors.size(); ++t) {
      tensors.push_back({{"name", specs[g].tensors[t].name},
                         {"shape", specs[g].tensors[t].shape},
                         {"offset_elems", layout.slots()[t].offset_elems}});
    }
    groups.push_back(
        {{"name", prefix + specs[g].name}, {"total_elems", engine.checkpoint().state_range(g).total_elems}, {"tensors", tensors}});
  }
  return groups;
}

nlohmann::json manifest_json(ZeroEngine& engine, Communicator& world, const TrainConfig& config,
                             const std::string& model_name, std::int64_t step, const nlohmann::json& files,
                             const nlohmann::json& groups, const CheckpointTensorParallel& tensor) {
  const EngineCounters counters = engine.checkpoint().counters();
  nlohmann::json scaler = nullptr;
  if (counters.loss_scaler) {
    scaler = {{"scale", counters.loss_scaler->scale},
              {"cur_hysteresis", counters.loss_scaler->cur_hysteresis},
              {"cur_iter", counters.loss_scaler->cur_iter},
              {"last_overflow_iter", counters.loss_scaler->last_overflow_iter}};
  }
  nlohmann::json arrays = nlohmann::json::array();
  for (int a = 0; a < engine.checkpoint().state_arrays(); ++a) arrays.push_back(kArrayNames[a]);
  nlohmann::json m = {{"format", "strata-checkpoint"},
          {"format_version", kCheckpointFormatVersion},
          {"model", model_name},
          {"step", step},
          {"optimizer_steps", counters.optimizer_steps},
          {"loss_scaler", scaler},
          {"seed", config.strata.seed},
          {"world_size", world.world_size()},
          {"sharding_factor", engine.plan().topo.sharding_factor},
          {"stage", config.zero.stage},
          {"precision", std::string(precision_name(config.precision))},
          {"optimizer", config.optimizer.type},
          {"state_arrays", arrays},
          {"groups", groups.is_null() ? groups_json(engine) : groups},
          {"files", files},
          {"config", config.raw}};
  if (tensor.size > 1 || tensor.slices > 1) m["tensor_parallel"] = {{"size", tensor.size}, {"slices", tensor.slices}};
  return m;
}

}  // namespace checkpoint_internal

namespace {

// Data files are read and hashed in pieces of this size.
constexpr std::size_t kIoPieceBytes = std::size_t{4} << 20;

struct XxhDeleter {
  void operator()(XXH64_state_t* s) const { XXH64_freeState(s); }
};
using XxhState = std::unique_ptr<XXH64_state_t, XxhDeleter>;

XxhState new_xxh64() {
  XxhState s(XXH64_createState());
  STRATA_CHECK(s != nullptr, "XXH64_createState failed");
  XXH64_reset(s.get(), 0);
  return s;
}

// A manifest or `latest` that cannot be read makes the checkpoint unusable: a FormatError, as a
// damaged one is.
std::string read_checkpoint_text(const std::string& path) {
  try {
    return read_text_file(path, "checkpoint file");
  } catch (const IoError& e) {
    throw FormatError(e.what());
  }
}

std::string latest_name(const std::string& parent) {
  const std::string path = parent + "/" + kCheckpointLatest;
  std::string text = read_checkpoint_text(path);
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  std::int64_t step = 0;
  if (!parse_step_dir(text, &step)) {
    throw FormatError(fmt::format("{} should name a checkpoint directory like step-00000120 but holds '{}'", path,
                                  text.substr(0, 64)));
  }
  return text;
}

std::uint64_t parse_hex(const ManifestFields& f, const std::string& text, const std::string& field) {
  if (text.size() != 16 || text.find_first_not_of("0123456789abcdef") != std::string::npos) {
    throw f.error(field, fmt::format("is not a 16-digit hex checksum ('{}')", text.substr(0, 40)));
  }
  return std::stoull(text, nullptr, 16);
}

// The manifest's scalar fields: format, version, model, counters, run settings, config.
void parse_run_fields(const ManifestFields& f, const nlohmann::json& j, CheckpointManifest& m) {
  if (f.get<std::string>(j, "format", "") != "strata-checkpoint") {
    throw f.error("format", "is not \"strata-checkpoint\"");
  }
  m.format_version = f.get<int>(j, "format_version", "");
  if (m.format_version < 1 || m.format_version > kCheckpointFormatVersion) {
    throw f.error("format_version", fmt::format("is {}; this Strata reads versions 1 to {}", m.format_version,
                                                kCheckpointFormatVersion));
  }
  m.model = f.get<std::string>(j, "model", "");
  m.step = f.get<std::int64_t>(j, "step", "");
  m.counters.optimizer_steps = f.get<std::int64_t>(j, "optimizer_steps", "");
  if (m.step < 0 || m.counters.optimizer_steps < 0 || m.counters.optimizer_steps > m.step) {
    throw f.error("optimizer_steps", fmt::format("{} does not fit step {}", m.counters.optimizer_steps, m.step));
  }
  if (!j.contains("loss_scaler")) throw f.error("loss_scaler", "is missing");
  if (!j["loss_scaler"].is_null()) {
    const auto& s = j["loss_scaler"];
    m.counters.loss_scaler = optim::LossScaler::State{
        f.get<double>(s, "scale", "loss_scaler"), f.get<int>(s, "cur_hysteresis", "loss_scaler"),
        f.get<std::int64_t>(s, "cur_iter", "loss_scaler"), f.get<std::int64_t>(s, "last_overflow_iter", "loss_scaler")};
  }
  m.seed = f.get<std::uint64_t>(j, "seed", "");
  m.world_size = f.get<int>(j, "world_size", "");
  m.sharding_factor = f.get<int>(j, "sharding_factor", "");
  if (j.contains("tensor_parallel")) {  // absent: written without tensor parallelism
    m.tensor_size = f.get<int>(j["tensor_parallel"], "size", "tensor_parallel");
    m.tensor_slices = f.get<int>(j["tensor_parallel"], "slices", "tensor_parallel");
    if (m.tensor_size < 1 || m.tensor_slices < 1) throw f.error("tensor_parallel", "needs size and slices >= 1");
  }
  m.stage = f.get<int>(j, "stage", "");
  m.precision = f.get<std::string>(j, "precision", "");
  m.optimizer = f.get<std::string>(j, "optimizer", "");
  m.state_arrays = static_cast<int>(f.get<std::vector<std::string>>(j, "state_arrays", "").size());
  if (m.state_arrays < 1 || m.state_arrays > 3) throw f.error("state_arrays", "must list 1 to 3 arrays");
  if (!j.contains("config")) throw f.error("config", "is missing");
  m.config = j["config"];
}

// The param groups and their tensors, each tensor inside its group's flat buffer.
void parse_groups(const ManifestFields& f, const nlohmann::json& j, CheckpointManifest& m) {
  const auto groups = f.get<std::vector<nlohmann::json>>(j, "groups", "");
  for (std::size_t g = 0; g < groups.size(); ++g) {
    const std::string where = fmt::format("groups[{}]", g);
    CheckpointGroup G;
    G.name = f.get<std::string>(groups[g], "name", where);
    G.total_elems = f.get<std::size_t>(groups[g], "total_elems", where);
    const auto tensors = f.get<std::vector<nlohmann::json>>(groups[g], "tensors", where);
    for (std::size_t t = 0; t < tensors.size(); ++t) {
      const std::string tw = fmt::format("{}.tensors[{}]", where, t);
      CheckpointTensor T;
      T.name = f.get<std::string>(tensors[t], "name", tw);
      T.shape = f.get<std::vector<std::int64_t>>(tensors[t], "shape", tw);
      T.offset_elems = f.get<std::size_t>(tensors[t], "offset_elems", tw);
      std::size_t n = 1;
      for (auto d : T.shape) {
        if (d < 0 || (d != 0 && n > G.total_elems / static_cast<std::size_t>(d))) {
          throw f.error(tw + ".shape", "has a negative dimension or more elements than its group");
        }
        n *= static_cast<std::size_t>(d);
      }
      if (T.offset_elems > G.total_elems || n > G.total_elems - T.offset_elems) {
        throw f.error(tw, "lies outside its group's flat buffer");
      }
      G.tensors.push_back(std::move(T));
    }
    m.groups.push_back(std::move(G));
  }
}

// (offset, elems) of every saved range, per group.
using GroupCover = std::vector<std::vector<std::pair<std::size_t, std::size_t>>>;

// One data file's record: each range inside its group and laid out after the previous one (at
// the next 4 KiB boundary since version 2), the file's size where its ranges end.
CheckpointFile parse_file(const ManifestFields& f, const nlohmann::json& record, const std::string& where,
                          const CheckpointManifest& m, GroupCover& cover) {
  CheckpointFile F;
  F.name = f.get<std::string>(record, "name", where);
  if (F.name.empty() || F.name.find('/') != std::string::npos || F.name[0] == '.') {
    throw f.error(where + ".name", fmt::format("'{}' is not a plain file name", F.name));
  }
  F.rank = f.get<int>(record, "rank", where);
  F.bytes = f.get<std::uint64_t>(record, "bytes", where);
  F.xxh64 = parse_hex(f, f.get<std::string>(record, "xxh64", where), where + ".xxh64");
  std::uint64_t cursor = 0;
  const auto ranges = f.get<std::vector<nlohmann::json>>(record, "ranges", where);
  for (std::size_t r = 0; r < ranges.size(); ++r) {
    const std::string rw = fmt::format("{}.ranges[{}]", where, r);
    CheckpointRange R;
    R.group = f.get<std::size_t>(ranges[r], "group", rw);
    R.offset_elems = f.get<std::size_t>(ranges[r], "offset_elems", rw);
    R.elems = f.get<std::size_t>(ranges[r], "elems", rw);
    R.file_offset_bytes = f.get<std::uint64_t>(ranges[r], "file_offset_bytes", rw);
    for (const auto& h : f.get<std::vector<std::string>>(ranges[r], "xxh64", rw)) {
      R.xxh64.push_back(parse_hex(f, h, rw + ".xxh64"));
    }
    if (R.group >= m.groups.size() || R.offset_elems > m.groups[R.group].total_elems ||
        R.elems > m.groups[R.group].total_elems - R.offset_elems) {
      throw f.error(rw, "lies outside the param groups");
    }
    if (m.format_version >= 2) cursor = align_to_range(cursor);
    if (R.file_offset_bytes != cursor || R.xxh64.size() != static_cast<std::size_t>(m.state_arrays)) {
      throw f.error(rw, "does not follow the previous range or lacks a checksum per state array");
    }
    // Data files of any real run are far below 2^60 bytes; the bound keeps the sums from wrapping.
    constexpr std::uint64_t kMaxFileBytes = std::uint64_t{1} << 60;
    const std::uint64_t element_bytes = static_cast<std::uint64_t>(m.state_arrays) * sizeof(float);
    if (R.elems > (kMaxFileBytes - cursor) / element_bytes) throw f.error(rw + ".elems", "is absurdly large");
    cursor += element_bytes * R.elems;
    cover[R.group].emplace_back(R.offset_elems, R.elems);
    F.ranges.push_back(std::move(R));
  }
  if (m.format_version >= 2) cursor = align_to_range(cursor);
  if (cursor != F.bytes) throw f.error(where + ".bytes", fmt::format("is {}, its ranges hold {}", F.bytes, cursor));
  return F;
}

// The files of the checkpoint cover every group's flat buffer exactly once.
void check_coverage(const ManifestFields& f, const CheckpointManifest& m, GroupCover& cover) {
  for (std::size_t g = 0; g < cover.size(); ++g) {
    std::sort(cover[g].begin(), cover[g].end());
    std::size_t at = 0;
    for (const auto& [off, n] : cover[g]) {
      if (off != at) {
        throw f.error("files", fmt::format("do not cover group {} ({}) exactly once: elements from {} are {}; a rank "
                                           "file is missing from the manifest",
                                           g, m.groups[g].name, at, off < at ? "saved twice" : "missing"));
      }
      at += n;
    }
    if (at != m.groups[g].total_elems) {
      throw f.error("files", fmt::format("cover {} of the {} elements of group {} ({})", at, m.groups[g].total_elems, g,
                                         m.groups[g].name));
    }
  }
}

}  // namespace

std::string checkpoint_dir_name(std::int64_t step) { return fmt::format("step-{:08}", step); }

std::optional<std::int64_t> latest_checkpoint_step(const std::string& parent) {
  std::error_code ec;
  if (!fs::exists(fs::path(parent) / kCheckpointLatest, ec)) return std::nullopt;
  std::int64_t step = 0;
  checkpoint_internal::parse_step_dir(latest_name(parent), &step);
  return step;
}

std::vector<std::int64_t> checkpoint_steps_in(const std::string& parent) {
  std::vector<std::int64_t> steps;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(parent, ec)) {
    std::int64_t step = 0;
    if (e.is_directory(ec) && checkpoint_internal::parse_step_dir(e.path().filename().string(), &step)) {
      steps.push_back(step);
    }
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

std::string resolve_checkpoint_dir(const std::string& dir) {
  if (fs::exists(fs::path(dir) / kCheckpointManifest)) return dir;
  if (fs::exists(fs::path(dir) / kCheckpointLatest)) {
    const std::string target = (fs::path(dir) / latest_name(dir)).string();
    if (!fs::exists(fs::path(target) / kCheckpointManifest)) {
      throw FormatError(
          fmt::format("{}/{} names {}, which has no {}", dir, kCheckpointLatest, target, kCheckpointManifest));
    }
    return target;
  }
  if (!fs::is_directory(dir)) {
    if (fs::exists(dir)) {
      throw FormatError(fmt::format("{} is a file, not a checkpoint: give a checkpoint directory (step-*) or the "
                                    "directory holding its `latest`",
                                    dir));
    }
    throw FormatError(fmt::format("checkpoint directory {} does not exist", dir));
  }
  throw FormatError(fmt::format("{} is not a checkpoint: it has neither {} nor a {} file naming one", dir,
                                kCheckpointManifest, kCheckpointLatest));
}

namespace {

// Note [Sealed manifest]: since format version 3 the manifest's last member is "manifest_xxh64",
// the XXH64 of the manifest's bytes as they would be without it (the JSON dumped with indent 1,
// ending in "\n}"). The seal covers the bytes, not the parsed values, so `ckpt verify` and every
// resume catch an edit of any byte: in the body the sum differs; in the seal the hex is wrong or
// the member is gone (a version 3 manifest must have it). Versions 1 and 2 have no seal and are
// read as before.
constexpr const char* kSealKey = "manifest_xxh64";

std::string seal_prefix() { return fmt::format(",\n \"{}\": \"", kSealKey); }

void check_seal(const std::string& text, const nlohmann::json& j, const std::string& path) {
  const nlohmann::json version = j.value("format_version", nlohmann::json());
  if (!j.contains(kSealKey)) {
    if (version.is_number_integer() && version.get<std::int64_t>() >= 3) {
      throw FormatError(fmt::format("checkpoint manifest {} has no \"{}\" (format version 3 seals its manifest): it "
                                    "was edited or damaged after it was written; restore it or use another checkpoint",
                                    path, kSealKey));
    }
    return;
  }
  const std::string prefix = seal_prefix();
  const std::size_t at = text.rfind(prefix);
  const std::size_t hex_at = at + prefix.size();
  const bool shaped = at != std::string::npos && text.size() == hex_at + 16 + 4 &&
                      text.compare(hex_at + 16, 4, "\"\n}\n") == 0 &&
                      text.find_first_not_of("0123456789abcdef", hex_at) == hex_at + 16;
  const std::string body = shaped ? text.substr(0, at) + "\n}" : std::string();
  if (!shaped || fmt::format("{:016x}", XXH64(body.data(), body.size(), 0)) != text.substr(hex_at, 16)) {
    throw FormatError(fmt::format("checkpoint manifest {} does not match its checksum (\"{}\"): it was edited or "
                                  "damaged after it was written; restore it or use another checkpoint",
                                  path, kSealKey));
  }
}

}  // namespace

std::string checkpoint_manifest_text(nlohmann::json manifest) {
  manifest.erase(kSealKey);
  const std::string body = manifest.dump(1);  // "{\n ...\n}"
  return body.substr(0, body.size() - 2) + seal_prefix() +
         fmt::format("{:016x}\"\n}}\n", XXH64(body.data(), body.size(), 0));
}

CheckpointManifest read_checkpoint_manifest(const std::string& dir_in) {
  CheckpointManifest m;
  m.dir = resolve_checkpoint_dir(dir_in);
  m.path = (fs::path(m.dir) / kCheckpointManifest).string();
  const ManifestFields f(m.path);
  JsonInputError error;
  const std::string text = read_checkpoint_text(m.path);
  std::optional<nlohmann::json> json = parse_json_input(text, JsonComments::Refuse, &error);
  if (!json) {
    throw FormatError(
        fmt::format("checkpoint manifest {} is not valid JSON ({}); the checkpoint is damaged", m.path, error.message));
  }
  if (json->is_object()) check_seal(text, *json, m.path);
  m.json = std::move(*json);
  parse_run_fields(f, m.json, m);
  parse_groups(f, m.json, m);
  GroupCover cover(m.groups.size());
  const auto files = f.get<std::vector<nlohmann::json>>(m.json, "files", "");
  for (std::size_t i = 0; i < files.size(); ++i) {
    m.files.push_back(parse_file(f, files[i], fmt::format("files[{}]", i), m, cover));
  }
  check_coverage(f, m, cover);
  return m;
}

CheckpointReader::CheckpointReader(CheckpointManifest manifest) : manifest_(std::move(manifest)) {}

CheckpointReader::~CheckpointReader() = default;

int CheckpointReader::fd_of(const CheckpointFile& file) {
  if (auto it = fds_.find(file.name); it != fds_.end()) return it->second.get();
  const std::string path = manifest_.dir + "/" + file.name;
  UniqueFd fd;
  try {
    fd = open_for_read(path, "checkpoint file", Symlinks::Refuse);
  } catch (const IoError& e) {
    if (e.errno_value() != ENOENT) throw;
    throw FormatError(fmt::format("checkpoint file {} is missing (the manifest lists it with the state of rank {})",
                                  path, file.rank));
  }
  return fds_.emplace(file.name, std::move(fd)).first->second.get();
}

void CheckpointReader::verify_file(const CheckpointFile& file) {
  const std::string path = manifest_.dir + "/" + file.name;
  const int fd = fd_of(file);
  const std::uint64_t size = file_size_bytes(fd, path);
  if (size != file.bytes) {
    throw FormatError(
        fmt::format("checkpoint file {} has {} bytes, the manifest says {}: it is truncated or was "
                    "overwritten",
                    path, size, file.bytes));
  }
  std::vector<char> buf(kIoPieceBytes);
  std::vector<std::uint64_t> digests;
  for (const CheckpointRange& r : file.ranges) {
    for (std::size_t a = 0; a < r.xxh64.size(); ++a) {
      XxhState s = new_xxh64();
      const std::uint64_t begin = r.file_offset_bytes + a * r.elems * sizeof(float);
      for (std::uint64_t done = 0; done < r.elems * sizeof(float);) {
        const std::size_t n =
            static_cast<std::size_t>(std::min<std::uint64_t>(kIoPieceBytes, r.elems * sizeof(float) - done));
        read_exact(fd, buf.data(), n, begin + done, path);
        XXH64_update(s.get(), buf.data(), n);
        done += n;
      }
      const std::uint64_t got = XXH64_digest(s.get());
      if (got != r.xxh64[a]) {
        throw FormatError(
            fmt::format("checkpoint file {}: checksum mismatch in group {} ({}) {} (bytes {}..{}): "
                        "xxh64 {} , the manifest says {}; the file is corrupt",
                        path, r.group, manifest_.groups[r.group].name, kArrayNames[a], begin,
                        begin + r.elems * sizeof(float), hex64(got), hex64(r.xxh64[a])));
      }
      digests.push_back(got);
    }
  }
  if (file_checksum(digests) != file.xxh64) {
    throw FormatError(fmt::format("checkpoint file {}: file checksum {} differs from the manifest's {}", path,
                                  hex64(file_checksum(digests)), hex64(file.xxh64)));
  }
}

std::vector<const CheckpointFile*> CheckpointReader::files_covering(std::size_t group, std::size_t offset_elems,
                                                                    std::size_t elems) const {
  std::vector<const CheckpointFile*> out;
  for (const CheckpointFile& f : manifest_.files) {
    for (const CheckpointRange& r : f.ranges) {
      if (r.group == group && r.offset_elems < offset_elems + elems && offset_elems < r.offset_elems + r.elems) {
        out.push_back(&f);
        break;
      }
    }
  }
  return out;
}

void CheckpointReader::read(std::size_t group, int array, std::size_t offset_elems, std::span<float> out) {
  STRATA_CHECK(array >= 0 && array < manifest_.state_arrays, "state array {} of {}", array, manifest_.state_arrays);
  std::fill(out.begin(), out.end(), 0.0f);
  const std::size_t end = offset_elems + out.size();
  for (const CheckpointFile& f : manifest_.files) {
    for (const CheckpointRange& r : f.ranges) {
      if (r.group != group) continue;
      const std::size_t x0 = std::max(offset_elems, r.offset_elems);
      const std::size_t x1 = std::min(end, r.offset_elems + r.elems);
      if (x0 >= x1) continue;
      const std::uint64_t at =
          r.file_offset_bytes + (static_cast<std::uint64_t>(array) * r.elems + (x0 - r.offset_elems)) * sizeof(float);
      read_exact(fd_of(f), out.data() + (x0 - offset_elems), (x1 - x0) * sizeof(float), at,
                 manifest_.dir + "/" + f.name);
    }
  }
}

std::vector<std::string> verify_checkpoint(const std::string& dir) {
  std::vector<std::string> problems;
  CheckpointManifest m;
  try {
    m = read_checkpoint_manifest(dir);
  } catch (const Error& e) {
    problems.emplace_back(e.what());
    return problems;
  }
  CheckpointReader reader(m);
  for (const CheckpointFile& f : reader.manifest().files) {
    try {
      reader.verify_file(f);
    } catch (const Error& e) {
      problems.emplace_back(e.what());
    }
  }
  return problems;
}

}  // namespace strata
