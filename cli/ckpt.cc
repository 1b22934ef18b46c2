// `strata ckpt verify|inspect|export DIR ...`: checkpoint tools (checkpoint/checkpoint.h).
//   verify DIR                   every file present, of the right size, every checksum right; exit 1
//                                naming each problem otherwise
//   inspect DIR [--json]         what is inside: model, step, layout, groups, files
//   export DIR OUT.safetensors   the consolidated master weights, read from every rank's file and
//          [--dtype fp32|bf16]   put back together into the untiled model's whole tensors: with
//          [--names strata|hf]   Strata names the file `strata train --save-weights` writes (byte for
//                                byte at fp32), with hf names a Hugging Face file (models/hf_names.h)
// DIR is a checkpoint directory or the parent holding `latest`.
#include "cli/commands.h"

#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/dtype_bulk.h"
#include "core/error.h"
#include "core/units.h"
#include "checkpoint/checkpoint.h"
#include "models/decoder_params.h"
#include "models/hf_config.h"
#include "models/hf_export.h"
#include "models/hf_names.h"
#include "models/model_config.h"
#include "models/safetensors.h"
#include "models/weights_io.h"
#include "train/checkpoint_tensors.h"
#include "train/output_file.h"
#include "train/trainer.h"

namespace strata::cli {

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

// The model of the run that wrote a checkpoint, from the config it records; a model folder gone since
// is named as the checkpoint's.
models::ModelConfig checkpoint_model(const CheckpointManifest& m) {
  bool activation_checkpointing = false;
  try {
    return train::training_model_config(parse_train_config(m.config, m.path + " (config)"), &activation_checkpointing);
  } catch (const ConfigError& e) {
    throw ConfigError(fmt::format("checkpoint {}: the model of the run that wrote it: {}", m.dir, e.what()));
  }
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
      "  written by world size {}{}, ZeRO stage {}, sharding factor {}; precision {}, optimizer {} ({} fp32 "
      "arrays per element)\n",
      m.world_size,
      m.tensor_size > 1 ? fmt::format(" ({} tensor ranks, {} slices)", m.tensor_size, m.tensor_slices) : std::string(),
      m.stage, m.sharding_factor, m.precision, m.optimizer, m.state_arrays);
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

// The whole tensors' fp32 master weights, in the untiled declaration order, from whatever cut the
// run made (tiles, tensor ranks).
struct WholeMaster {
  ParamTensorSpec spec;
  std::vector<float> values;
};
std::vector<WholeMaster> consolidated_master(CheckpointReader& reader, const models::ModelConfig& model) {
  const train::CheckpointTensors tensors(reader.manifest(), model);
  std::vector<WholeMaster> out;
  for (const ParamTensorSpec& t : tensors.tensors()) out.push_back(WholeMaster{t, tensors.read(reader, t.name, 0)});
  return out;
}

struct ExportOptions {
  std::string dir, out, dtype = "fp32", names, max_shard_size = "5GB";
  bool hf_folder = false;
};

// `ckpt export DIR OUT --hf`: a folder transformers loads (models/hf_export.h), with the config and
// tokenizer of the Hugging Face folder the run was started from, when it was.
int run_export_hf_folder(const ExportOptions& o, CheckpointReader& reader, const models::ModelConfig& model,
                         DType dtype) {
  const CheckpointManifest& m = reader.manifest();
  const std::optional<std::string_view> hf_class = models::hf_model_class(model.arch);
  if (!hf_class) {
    throw ConfigError(fmt::format("--hf: model '{}' of checkpoint {} has architecture '{}', which has no Hugging Face "
                                  "names in Strata; export a file with --names strata",
                                  m.model, m.dir, models::architecture_name(model.arch)));
  }
  std::size_t max_shard = 0;
  if (!parse_bytes(o.max_shard_size, &max_shard) || max_shard == 0) {
    throw ConfigError(fmt::format("--max-shard-size {}: give a positive size such as 5GB, 500MiB or 2000000000 (each "
                                  "weights file of the folder holds at most this many bytes)",
                                  o.max_shard_size));
  }
  std::string out = o.out;
  while (out.size() > 1 && out.back() == '/') out.pop_back();
  models::HfExport e;
  e.out_dir = out;
  e.model = model;
  e.dtype = dtype;
  e.max_shard_bytes = max_shard;
  e.metadata = {{"strata.model", m.model}, {"strata.step", std::to_string(m.step)}};
  std::vector<std::string> input_dirs = {m.dir};
  const nlohmann::json& source = m.config.contains("strata") ? m.config["strata"].value("model", nlohmann::json()) : nlohmann::json();
  if (source.is_string() && models::is_hf_model_folder(source.get<std::string>())) {
    const models::HfModelFolder folder = models::open_hf_model_folder(source.get<std::string>());
    e.source_config = folder.config_json;
    e.companion_files = folder.companion_files;
    input_dirs.push_back(folder.dir);
  }
  std::error_code ec;
  if (!std::filesystem::exists(out, ec)) train::check_output_path(out, "strata ckpt export OUT", train::OutputWrite::Replaced);
  train::check_output_not_input(out, "strata ckpt export OUT", {(std::filesystem::path(o.dir) / kCheckpointLatest).string()},
                         input_dirs);
  for (const auto& f : m.files) reader.verify_file(f);
  const train::CheckpointTensors tensors(m, model);
  const models::HfExportResult r = models::write_hf_model_folder(
      e, [&](const ParamTensorSpec& t, std::vector<float>& values) { values = tensors.read(reader, t.name, 0); });
  fmt::print("wrote {} tensors ({}, Hugging Face folder for {}) of step {} to {}: {} in {}, config.json, "
             "generation_config.json{}\n",
             r.tensors, o.dtype, *hf_class, m.step, out, format_bytes(r.weight_bytes),
             r.weight_files.size() == 1 ? r.weight_files[0]
                                        : fmt::format("{} shards + model.safetensors.index.json", r.weight_files.size()),
             e.companion_files.empty() ? std::string()
                                       : fmt::format(", {} file(s) of the source folder", e.companion_files.size()));
  return 0;
}

int run_export(const ExportOptions& o) {
  const std::string& dir = o.dir;
  const std::string& out = o.out;
  const std::string& dtype_name = o.dtype;
  if (o.hf_folder && !o.names.empty() && o.names != "hf") {
    throw ConfigError(fmt::format("--hf writes a Hugging Face folder, whose weights carry Hugging Face names; drop "
                                  "--names {}",
                                  o.names));
  }
  if (!o.hf_folder && o.max_shard_size != "5GB") {
    throw ConfigError("--max-shard-size applies to a Hugging Face folder (--hf); a single file is never split");
  }
  const std::string names = o.names.empty() ? "strata" : o.names;
  if (dtype_name != "fp32" && dtype_name != "bf16") {
    throw ConfigError(fmt::format("--dtype {}: choose fp32 or bf16", dtype_name));
  }
  if (names != "strata" && names != "hf") {
    throw ConfigError(fmt::format("--names {}: choose strata (Strata's tensor names, the default) or hf (the Hugging "
                                  "Face names of the model's architecture)",
                                  names));
  }
  const DType dtype = dtype_name == "bf16" ? DType::BF16 : DType::F32;
  const models::WeightNaming naming = names == "hf" ? models::WeightNaming::HuggingFace : models::WeightNaming::Strata;
  CheckpointReader reader(read_checkpoint_manifest(dir));
  const CheckpointManifest& m = reader.manifest();
  if (o.hf_folder) {
    return run_export_hf_folder(o, reader, checkpoint_model(m), dtype);
  }
  // OUT is replaced whole; it must not be a file of the checkpoint it is made from (a data file,
  // the manifest, the `latest` that named it), nor anywhere inside that checkpoint's directory.
  train::check_output_path(out, "strata ckpt export OUT", train::OutputWrite::Replaced);
  train::check_output_not_input(out, "strata ckpt export OUT", {(std::filesystem::path(dir) / kCheckpointLatest).string()}, {m.dir});
  const models::ModelConfig model = checkpoint_model(m);
  const std::optional<std::string_view> hf_class = models::hf_model_class(model.arch);
  if (naming == models::WeightNaming::HuggingFace && !hf_class) {
    throw ConfigError(fmt::format("--names hf: model '{}' of checkpoint {} has architecture '{}', which has no Hugging "
                                  "Face names in Strata; export it with --names strata",
                                  m.model, m.dir, models::architecture_name(model.arch)));
  }
  for (const auto& f : m.files) reader.verify_file(f);

  std::map<std::string, models::HfTensorName> hf_of;
  for (auto& h : models::hf_tensor_names(model)) hf_of.emplace(h.strata_name, h);

  std::vector<std::vector<std::byte>> values;
  std::vector<models::SafetensorsTensorOut> tensors;
  for (WholeMaster& whole : consolidated_master(reader, model)) {
    std::vector<float>& master = whole.values;
    std::string name = whole.spec.name;
    std::vector<std::int64_t> shape = whole.spec.shape;
    if (naming == models::WeightNaming::HuggingFace) {
      const models::HfTensorName& h = hf_of.at(whole.spec.name);
      name = h.hf_name;
      if (h.transposed) {  // GPT-2's Conv1D weights are stored [in, out]
        master = models::transposed_matrix(master, shape[0], shape[1]);
        std::swap(shape[0], shape[1]);
      }
    }
    std::vector<std::byte> bytes(master.size() * dtype_bytes(dtype));
    convert_parallel(master.data(), DType::F32, bytes.data(), dtype, master.size());
    values.push_back(std::move(bytes));
    tensors.push_back(models::SafetensorsTensorOut{std::move(name), dtype, std::move(shape), values.back().data()});
  }
  if (naming == models::WeightNaming::Strata) {
    // The same metadata as `strata train --save-weights`, so the two files can be compared byte for byte.
    models::write_safetensors(
        out, tensors,
        {{"format", "strata"}, {"model", m.model}, {"arch", std::string(models::architecture_name(model.arch))}});
  } else {
    // "format": "pt" is what Hugging Face's loaders require of a safetensors file; the rest is
    // models::save_weights' Hugging Face metadata.
    models::write_safetensors(out, tensors,
                              {{"format", "pt"},
                               {"strata.model", m.model},
                               {"strata.arch", std::string(models::architecture_name(model.arch))},
                               {"strata.hf_class", std::string(*hf_class)}});
  }
  const std::string naming_text =
      naming == models::WeightNaming::Strata ? "Strata names" : fmt::format("Hugging Face names for {}", *hf_class);
  fmt::print("wrote {} tensors ({}, {}) of step {} to {}\n", tensors.size(), dtype_name, naming_text, m.step, out);
  return 0;
}

}  // namespace

void register_ckpt(CLI::App& ckpt, bench::CommandTable& table) {
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
    auto o = std::make_shared<ExportOptions>();
    auto* cmd = ckpt.add_subcommand("export", "write a checkpoint's consolidated weights as safetensors, or as a "
                                              "Hugging Face model folder (--hf)");
    cmd->add_option("DIR", o->dir, "checkpoint directory, or the parent holding `latest`")->required();
    cmd->add_option("OUT", o->out, "output .safetensors file (a new folder with --hf)")->required();
    cmd->add_option("--dtype", o->dtype, "fp32 (default) or bf16");
    cmd->add_option("--names", o->names,
                    "strata (default: Strata's names, as --save-weights writes) or hf (Hugging Face names of the "
                    "model's architecture, GPT-2 Conv1D weights transposed, a tied head omitted)");
    cmd->add_flag("--hf", o->hf_folder,
                  "write OUT as a folder AutoModelForCausalLM.from_pretrained loads: config.json, "
                  "generation_config.json, the tokenizer files of the model folder the run started from, and "
                  "model.safetensors (sharded with an index above --max-shard-size)");
    cmd->add_option("--max-shard-size", o->max_shard_size, "with --hf: the most bytes per weights file (default 5GB)");
    table[cmd] = [o] { return run_export(*o); };
  }
}

}  // namespace strata::cli
