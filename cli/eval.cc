// `strata eval`: mean cross-entropy (and perplexity) of given weights on given token data, walking
// the data in consecutive windows of --seq-len tokens from the start (targets shifted by one; a
// loss mask's targets left out, Note [Loss mask] in models/token_data.h), so the
// figure depends on no seed. Runs the model with all weights resident on the device --device picks
// (auto: a GPU when one is usable, else the sim device).
#include "cli/commands.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/device/device.h"
#include "core/error.h"
#include "core/units.h"
#include "models/decoder.h"
#include "models/resident_provider.h"
#include "models/token_data.h"
#include "models/weights_io.h"
#include "train/compute_device.h"
#include "train/model_source.h"

namespace strata::cli {

namespace {

struct EvalOptions {
  std::string model;
  std::string weights;
  std::string data;
  std::int64_t batches = 0;  // 0: every window
  std::int64_t seq_len = 0;  // 0: min(256, the model's max_seq_len)
  std::int64_t batch_size = 4;
  bool flat_u32 = false;
  bool json = false;
  std::string device = "auto";  // sim | cuda | auto
};

// The machine's memory in bytes (0 when unknown).
std::uint64_t physical_memory_bytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES);
  const long page_bytes = ::sysconf(_SC_PAGESIZE);
  return pages > 0 && page_bytes > 0 ? static_cast<std::uint64_t>(pages) * static_cast<std::uint64_t>(page_bytes) : 0;
}

// The device the model and one batch's activations live on, sized to them; a batch too large for
// this machine (sim) or the GPU (cuda) is refused naming the flag to lower.
std::unique_ptr<Device> open_eval_device(const EvalOptions& o, const models::ModelConfig& config,
                                         const models::Decoder& decoder, std::int64_t batch_windows) {
  std::size_t param_bytes = 0;
  for (const auto& g : decoder.param_groups()) param_bytes += g.bytes() + 256 * g.tensors.size();
  SimDeviceOptions dev_opts;
  const std::uint64_t activation_bytes = decoder.activation_bytes(batch_windows, o.seq_len, false);
  dev_opts.capacity_bytes = 2 * param_bytes + activation_bytes + (64u << 20);
  dev_opts.capacity_knob = "strata eval --batch-size and --seq-len";
  const DeviceChoice choice = train::parse_device_flag(o.device);
  const std::uint64_t host_bytes = physical_memory_bytes();
  const DeviceKind kind = train::resolve_device_kind(choice, {"strata eval", "--device"});  // train::open_compute_device's
  if (kind == DeviceKind::Sim && host_bytes > 0 && dev_opts.capacity_bytes > host_bytes) {
    // Every byte of one batch's activations is written, so a device larger than the machine's
    // memory would fail mid-run; say which flag to lower instead.
    const std::uint64_t per_window = std::max<std::uint64_t>(1, activation_bytes / static_cast<std::uint64_t>(batch_windows));
    const std::uint64_t fixed = 2 * param_bytes + (64u << 20);
    const std::uint64_t fit = host_bytes > fixed ? (host_bytes - fixed) / per_window : 0;
    throw ConfigError(fmt::format("--batch-size {} with --seq-len {} needs {} of memory for model '{}' ({} of "
                                  "activations), more than this machine's {}; lower --batch-size (at most {} fit)",
                                  o.batch_size, o.seq_len, format_bytes(dev_opts.capacity_bytes), config.name,
                                  format_bytes(activation_bytes), format_bytes(host_bytes), fit));
  }
  auto device = train::open_compute_device(choice, 0, dev_opts, {"strata eval", "--device"});
  if (device->kind() == DeviceKind::Cuda && dev_opts.capacity_bytes > device->capacity_bytes()) {
    throw ConfigError(fmt::format("--batch-size {} with --seq-len {} needs {} of device memory for model '{}' ({} of "
                                  "activations), more than the {} free on {}; lower --batch-size",
                                  o.batch_size, o.seq_len, format_bytes(dev_opts.capacity_bytes), config.name,
                                  format_bytes(activation_bytes), format_bytes(device->capacity_bytes()),
                                  device->name()));
  }
  return device;
}

void print_eval(const EvalOptions& o, const models::ModelConfig& config, models::WeightNaming naming,
                const models::TokenFile& data, std::int64_t windows, const models::LossSum& total) {
  const double loss = total.mean();
  // A loss mask (Note [Loss mask] in models/token_data.h) leaves the prompts' targets out of the mean.
  const std::int64_t masked = windows * o.seq_len - total.tokens;
  const bool strata_names = naming == models::WeightNaming::Strata;
  if (o.json) {
    nlohmann::json j = {{"model", config.name},   {"weights", o.weights},     {"data", o.data},
                        {"seq_len", o.seq_len},   {"windows", windows},        {"tokens", total.tokens},
                        {"masked_targets", masked},
                        {"loss", loss},           {"perplexity", std::exp(loss)},
                        {"weight_names", strata_names ? "strata" : "huggingface"}};
    std::printf("%s\n", j.dump().c_str());
    return;
  }
  std::printf("model %s, weights %s (%s names), data %s\n", config.name.c_str(), o.weights.c_str(),
              strata_names ? "Strata" : "Hugging Face", o.data.c_str());
  const std::string masked_note =
      data.has_loss_mask() ? fmt::format(", {} masked by the loss mask not counted", masked) : std::string();
  std::printf("%lld windows of %lld tokens (%lld tokens%s): loss %.6f nats/token, perplexity %.4f\n",
              static_cast<long long>(windows), static_cast<long long>(o.seq_len), static_cast<long long>(total.tokens),
              masked_note.c_str(), loss, std::exp(loss));
}

int run_eval(EvalOptions o) {
  using namespace strata::models;
  // A Hugging Face model folder gives the model and, unless --weights says otherwise, the weights.
  const train::ModelSource source = train::resolve_model_source(o.model, o.weights, "strata eval");
  const ModelConfig& config = source.config;
  o.weights = source.weights;
  if (o.seq_len == 0) o.seq_len = std::min<std::int64_t>(256, config.max_seq_len);
  if (o.seq_len < 1 || o.seq_len > config.max_seq_len) {
    throw ConfigError(fmt::format("--seq-len {} must be in 1..{} for model '{}'", o.seq_len, config.max_seq_len, config.name));
  }
  if (o.batch_size < 1) throw ConfigError("--batch-size must be at least 1");
  if (o.batches < 0) throw ConfigError("--batches must be positive (or 0 for all windows)");
  const TokenFile data = TokenFile::open(o.data, o.flat_u32 ? FlatTokenWidth::U32 : FlatTokenWidth::U16);
  train::check_data_tokenizer(data, o.data, source.folder);
  data.check_vocab(config.vocab_size);
  const ConsecutiveWindows windows(data, o.seq_len);
  if (windows.count() == 0) {
    throw ConfigError(fmt::format("--data '{}' has {} tokens, fewer than one window of --seq-len + 1 = {}", o.data,
                                  data.size(), o.seq_len + 1));
  }
  std::int64_t todo = windows.count();
  if (o.batches > 0 && o.batches < (todo + o.batch_size - 1) / o.batch_size) todo = o.batches * o.batch_size;
  // No forward pass holds more windows than there are to evaluate.
  const std::int64_t batch_windows = std::min(o.batch_size, todo);

  Decoder decoder(config, {});
  auto device = open_eval_device(o, config, decoder, batch_windows);
  train::ComputeStream cs(*device, "compute");
  ResidentParamProvider params(decoder.param_groups(), device.get());
  const WeightNaming naming = load_weights(o.weights, config, params, &cs.stream());
  const DecoderRuntime rt{cs.context(), device.get()};

  LossSum total;
  std::vector<std::int32_t> in(static_cast<std::size_t>(batch_windows * o.seq_len)), tg(in.size());
  for (std::int64_t w = 0; w < todo; w += batch_windows) {
    const std::int64_t b = std::min(batch_windows, todo - w);
    for (std::int64_t i = 0; i < b; ++i) windows.window(w + i, in.data() + i * o.seq_len, tg.data() + i * o.seq_len);
    const LossSum s = decoder.forward_loss(rt, params, in.data(), tg.data(), b, o.seq_len);
    total.sum += s.sum;
    total.tokens += s.tokens;
  }
  if (total.tokens == 0) {
    throw FormatError(fmt::format("--data '{}': every target of the {} windows evaluated is masked by the file's loss "
                                  "mask, so there is no loss to average; evaluate more windows (--batches) or data with "
                                  "completions",
                                  o.data, todo));
  }
  print_eval(o, config, naming, data, todo, total);
  return 0;
}

}  // namespace

void register_eval(CLI::App& app, bench::CommandTable& table) {
  auto opts = std::make_shared<EvalOptions>();
  auto* cmd = app.add_subcommand("eval", "mean cross-entropy of weights on token data (consecutive windows)");
  train::add_model_flags(*cmd, opts->model, opts->weights);
  cmd->add_option("--data", opts->data, "token file (Strata, llm.c or flat uint16)")->required();
  cmd->add_option("--batches", opts->batches, "batches of --batch-size windows to evaluate (default: all)");
  cmd->add_option("--seq-len", opts->seq_len, "tokens per window (default: 256, or the model's max_seq_len if shorter)");
  cmd->add_option("--batch-size", opts->batch_size, "windows per forward pass (default 4)");
  cmd->add_flag("--flat-u32", opts->flat_u32, "a headerless token file holds uint32 tokens (default uint16)");
  cmd->add_flag("--json", opts->json, "print one JSON object");
  cmd->add_option("--device", opts->device, "sim, cuda or auto (a GPU when one is usable; default auto)");
  table[cmd] = [opts]() { return run_eval(*opts); };
}

}  // namespace strata::cli
