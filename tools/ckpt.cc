// `strata ckpt verify|inspect|export DIR ...`: checkpoint tools (engine/checkpoint.h).
//   verify DIR                   every file present, of the right size, every checksum right; exit 1
//                                naming each problem otherwise
//   inspect DIR [--json]         what is inside: model, step, layout, groups, files
//   export DIR OUT.safetensors   the consolidated fp32 master weights with Strata names (what
//          [--dtype fp32|bf16]   `strata train --save-weights` writes), read from every rank's file
// DIR is a checkpoint directory or the parent holding `latest`.
#include "tools/commands.h"

#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/dtype_bulk.h"
#include "core/error.h"
#include "core/units.h"
#include "engine/checkpoint.h"
#include "models/model_config.h"
#include "models/safetensors.h"
#include "tools/trainer.h"

namespace strata::tools {

namespace {

int run_verify(const std::string& dir) {
  const std::vector<std::string> problems = verify_checkpoint(dir);
  if (!problems.empty()) {
    for (const auto& p : problems) std::fprintf(stderr, "strata ckpt verify: %s\n", p.c_str());
    std::fprintf(stderr, "strata ckpt verify: %s is NOT usable (%zu problem%s)\n", dir.c_str(), problems.size(),
                 problems.size() == 1 ? "" : "s");
    return 1;
  }
  const CheckpointManifest m = read_checkpoint_manifest(dir);
  std::uint64_t bytes = 0;
  for (const auto& f : m.files) bytes += f.bytes;
  std::printf("ok: %s: step %lld, %zu file%s, %s, every checksum matches\n", m.dir.c_str(),
              static_cast<long long>(m.step), m.files.size(), m.files.size() == 1 ? "" : "s",
              format_bytes(bytes).c_str());
  return 0;
}

int run_inspect(const std::string& dir, bool json) {
  const CheckpointManifest m = read_checkpoint_manifest(dir);
  if (json) {
    std::printf("%s\n", m.json.dump(2).c_str());
    return 0;
  }
  std::uint64_t bytes = 0;
  for (const auto& f : m.files) bytes += f.bytes;
  std::string scaler = "none";
  if (m.counters.loss_scaler) {
    scaler = fmt::format("scale {} (hysteresis {}, iteration {}, last overflow {})", m.counters.loss_scaler->scale,
                         m.counters.loss_scaler->cur_hysteresis, m.counters.loss_scaler->cur_iter,
                         m.counters.loss_scaler->last_overflow_iter);
  }
  fmt::print("checkpoint {}\n", m.dir);
  fmt::print("  format version {}, model {}, step {} ({} optimizer steps applied), seed {}\n", m.format_version,
             m.model, m.step, m.counters.optimizer_steps, m.seed);
  fmt::print(
      "  written by world size {}, ZeRO stage {}, sharding factor {}; precision {}, optimizer {} ({} fp32 "
      "arrays per element)\n",
      m.world_size, m.stage, m.sharding_factor, m.precision, m.optimizer, m.state_arrays);
  fmt::print("  loss scaler: {}\n", scaler);
  std::size_t tensors = 0, elems = 0;
  for (const auto& g : m.groups) {
    tensors += g.tensors.size();
    elems += g.total_elems;
  }
  fmt::print("  {} param groups, {} tensors, {} elements (padded)\n", m.groups.size(), tensors, elems);
  for (const auto& g : m.groups) {
    std::vector<std::string> names;
    for (const auto& t : g.tensors) names.push_back(fmt::format("{} {}", t.name, nlohmann::json(t.shape).dump()));
    fmt::print("    {:<16} {:>10} elems: {}\n", g.name, g.total_elems, fmt::join(names, ", "));
  }
  fmt::print("  {} data file{}, {}:\n", m.files.size(), m.files.size() == 1 ? "" : "s", format_bytes(bytes));
  for (const auto& f : m.files) {
    fmt::print("    {} (rank {}): {}, xxh64 {:016x}, {} ranges\n", f.name, f.rank, format_bytes(f.bytes), f.xxh64,
               f.ranges.size());
  }
  return 0;
}

int run_export(const std::string& dir, const std::string& out, const std::string& dtype_name) {
  if (dtype_name != "fp32" && dtype_name != "bf16") {
    throw ConfigError(fmt::format("--dtype {}: choose fp32 or bf16", dtype_name));
  }
  const DType dtype = dtype_name == "bf16" ? DType::BF16 : DType::F32;
  CheckpointReader reader(read_checkpoint_manifest(dir));
  for (const auto& f : reader.manifest().files) reader.verify_file(f);
  std::vector<std::vector<std::byte>> values;
  std::vector<models::SafetensorsTensorOut> tensors;
  for (std::size_t g = 0; g < reader.manifest().groups.size(); ++g) {
    for (const auto& t : reader.manifest().groups[g].tensors) {
      std::size_t n = 1;
      for (auto d : t.shape) n *= static_cast<std::size_t>(d);
      std::vector<float> master(n);
      reader.read(g, 0, t.offset_elems, master);
      std::vector<std::byte> bytes(n * dtype_bytes(dtype));
      convert_parallel(master.data(), DType::F32, bytes.data(), dtype, n);
      values.push_back(std::move(bytes));
      tensors.push_back(models::SafetensorsTensorOut{t.name, dtype, t.shape, values.back().data()});
    }
  }
  const CheckpointManifest& m = reader.manifest();
  // The same metadata as `strata train --save-weights`, so the two files can be compared byte for byte.
  bool activation_checkpointing = false;
  const models::ModelConfig model =
      training_model_config(parse_train_config(m.config, m.path + " (config)"), &activation_checkpointing);
  models::write_safetensors(
      out, tensors,
      {{"format", "strata"}, {"model", m.model}, {"arch", std::string(models::architecture_name(model.arch))}});
  std::printf("wrote %zu tensors (%s) of step %lld to %s\n", tensors.size(), dtype_name.c_str(),
              static_cast<long long>(m.step), out.c_str());
  return 0;
}

}  // namespace

void register_ckpt(CLI::App& ckpt, CommandTable& table) {
  {
    auto dir = std::make_shared<std::string>();
    auto* cmd = ckpt.add_subcommand("verify", "check a checkpoint's files and checksums (exit 1 naming each problem)");
    cmd->add_option("DIR", *dir, "checkpoint directory, or the parent holding `latest`")->required();
    table[cmd] = [dir] { return run_verify(*dir); };
  }
  {
    auto dir = std::make_shared<std::string>();
    auto json = std::make_shared<bool>(false);
    auto* cmd = ckpt.add_subcommand("inspect", "show what a checkpoint holds");
    cmd->add_option("DIR", *dir, "checkpoint directory, or the parent holding `latest`")->required();
    cmd->add_flag("--json", *json, "print the manifest as JSON");
    table[cmd] = [dir, json] { return run_inspect(*dir, *json); };
  }
  {
    auto dir = std::make_shared<std::string>();
    auto out = std::make_shared<std::string>();
    auto dtype = std::make_shared<std::string>("fp32");
    auto* cmd = ckpt.add_subcommand("export", "write a checkpoint's consolidated weights as safetensors");
    cmd->add_option("DIR", *dir, "checkpoint directory, or the parent holding `latest`")->required();
    cmd->add_option("OUT", *out, "output .safetensors file")->required();
    cmd->add_option("--dtype", *dtype, "fp32 (default) or bf16");
    table[cmd] = [dir, out, dtype] { return run_export(*dir, *out, *dtype); };
  }
}

}  // namespace strata::tools
