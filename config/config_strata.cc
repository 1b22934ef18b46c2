// The `strata` section of the training config (config/config.h): Strata's own keys beside
// DeepSpeed's (model, data, device, checkpoints, offload, parallelism, tiling).
#include <cstdint>
#include <limits>
#include <string>

#include <fmt/format.h>

#include "core/error.h"
#include "config/config.h"
#include "config/config_reader.h"

namespace strata {
namespace {

// strata.device: the slowest modeled link (10 MB/s) and the longest modeled latency per copy (0.1 s).
constexpr double kMinModeledGbps = 0.01;
constexpr double kMinModeledTflops = 1e-3;  // 1 GFLOP/s
constexpr double kMaxModeledLatencyUs = 1e5;


// strata.data: the token files and how they are read.
void parse_data_section(ConfigReader d, StrataConfig& s) {
  d.get_string("train", &s.data.train);
  if (s.data.train.empty()) {
    d.fail("train", "is empty; name a token file, a text file, or \"fortunes\" (the built-in corpus)");
  }
  d.get_string("validation", &s.data.validation);
  d.get_int("validation_interval_steps", &s.data.validation_interval_steps, 0, std::numeric_limits<std::int64_t>::max());
  d.get_int("validation_windows", &s.data.validation_windows, 0, std::numeric_limits<std::int64_t>::max());
  d.get_choice("format", &s.data.format, {"auto", "text", "tokens"});
  d.get_int("seq_len", &s.data.seq_len, 2, 1 << 20);
  d.get_double("validation_fraction", &s.data.validation_fraction, 0.0, 0.5);
  d.finish();
}

// strata.device: the device kind, its memory and the sim device's modeled link and compute.
void parse_device_section(ConfigReader d, StrataConfig& s) {
  std::string kind = "auto";
  d.get_choice("kind", &kind, {"auto", "sim", "cuda"});
  s.device.kind = kind == "sim" ? DeviceChoice::Sim : kind == "cuda" ? DeviceChoice::Cuda : DeviceChoice::Auto;
  d.get_bytes("memory", &s.device.memory_bytes, 0);
  if (d.has("memory") && !d.is_auto("memory") && s.device.memory_bytes == 0) {
    d.fail("memory", "0 B is no device memory; give a size such as \"8GiB\", or leave the key out (or write "
                     "\"auto\") for the default");
  }
  // The modeled link (Note [Modeled link], core/device/sim_link.h): a bandwidth so low, or a
  // latency so high, that a step would take hours is a typo, not a model of a link.
  const auto get_gbps = [&d](std::string_view key, double* gbps) {
    d.get_double(key, gbps, 0.0, 1e4);
    if (*gbps > 0 && *gbps < kMinModeledGbps) {
      d.fail(key, fmt::format("{} GB/s is too slow to model a link (a step would not finish); use at least {} "
                              "GB/s, or 0 for copies at memory speed",
                              *gbps, kMinModeledGbps));
    }
  };
  get_gbps("h2d_gbps", &s.device.h2d_gbps);
  get_gbps("d2h_gbps", &s.device.d2h_gbps);
  d.get_double("latency_us", &s.device.latency_us, 0.0, kMaxModeledLatencyUs);
  d.get_double("compute_tflops", &s.device.compute_tflops, 0.0, 1e6);
  if (s.device.compute_tflops > 0 && s.device.compute_tflops < kMinModeledTflops) {
    d.fail("compute_tflops", fmt::format("{} TFLOPS is too slow to model a device (a step would not finish); use at "
                                         "least {} TFLOPS, or 0 for the host's speed",
                                         s.device.compute_tflops, kMinModeledTflops));
  }
  d.get_count("chaos", &s.device.chaos_seed, 0, UINT64_MAX);
  d.finish();
}

// strata.checkpoint: where and how often.
void parse_checkpoint_section(ConfigReader c, StrataConfig& s) {
  c.get_string("dir", &s.checkpoint.dir);
  c.get_int("interval_steps", &s.checkpoint.interval_steps, 0, std::numeric_limits<std::int64_t>::max());
  c.get_double("interval_minutes", &s.checkpoint.interval_minutes, 0.0, 1e7);
  c.get_int("keep", &s.checkpoint.keep, 1, 1000);
  c.finish();
  if ((s.checkpoint.interval_steps > 0 || s.checkpoint.interval_minutes > 0) && s.checkpoint.dir.empty()) {
    c.fail("dir", "a checkpoint interval is set but no directory; set strata.checkpoint.dir");
  }
}

// strata.offload: the pinned pools and the host budget.
void parse_offload_section(ConfigReader o, StrataConfig& s) {
  o.get_bytes("pinned_buffer", &s.offload.pinned_buffer_bytes, 1 << 20);
  o.get_bool("overlap_optimizer", &s.offload.overlap_optimizer);
  o.get_bytes("host_budget", &s.offload.host_budget_bytes, 1 << 20);  // absent or "auto": stays 0
  s.offload.host_budget_auto = s.offload.host_budget_bytes == 0;
  o.finish();
}

// strata.parallel: tensor, pipeline and sequence parallelism.
void parse_parallel_section(ConfigReader par, StrataConfig& s) {
  par.get_int("tensor", &s.parallel.tensor, 1, 1024);
  par.get_int("pipeline", &s.parallel.pipeline, 1, 1024);
  par.get_int("tensor_slices", &s.parallel.tensor_slices, 1, 1024);  // absent: 0, the tensor ranks
  std::string schedule = "1f1b";
  par.get_choice("schedule", &schedule, {"gpipe", "1f1b"});
  s.parallel.schedule = schedule == "gpipe" ? PipelineSchedule::GPipe : PipelineSchedule::OneFOneB;
  par.get_bool("stage_recompute", &s.parallel.stage_recompute);
  par.get_bool("sequence", &s.parallel.sequence);
  std::string communicator = "auto";
  par.get_choice("communicator", &communicator, {"auto", "mpi", "nccl"});
  s.parallel.communicator = communicator == "mpi"    ? CommunicatorChoice::Mpi
                            : communicator == "nccl" ? CommunicatorChoice::Nccl
                                                     : CommunicatorChoice::Auto;
  nlohmann::json layers;
  par.get_raw("pipeline_layers", &layers);
  if (!layers.is_null()) {
    const auto bad = [&] {
      par.fail("pipeline_layers", fmt::format("expected a list of positive layer counts, one per stage (first stage "
                                              "first), found {}",
                                              layers.dump()));
    };
    if (!layers.is_array() || layers.empty()) bad();
    for (const auto& v : layers) {
      if (!v.is_number_integer() || v.get<std::int64_t>() < 1) bad();
      s.parallel.pipeline_layers.push_back(v.get<std::int64_t>());
    }
  }
  par.finish();
}

}  // namespace

StrataConfig parse_strata(ConfigReader r) {
  StrataConfig s;
  r.get_bool("exact", &s.exact);
  r.get_count("seed", &s.seed, 0, std::numeric_limits<std::uint64_t>::max());
  r.get_raw("model", &s.model);
  if (!s.model.is_string() && !s.model.is_object()) r.fail("model", "expected a model name (e.g. \"tiny\") or an object of fields");
  parse_data_section(r.section("data"), s);
  r.get_string("init_weights", &s.init_weights);
  parse_device_section(r.section("device"), s);
  parse_checkpoint_section(r.section("checkpoint"), s);
  r.get_int("steps", &s.steps, 0, std::numeric_limits<std::int64_t>::max());
  r.get_int("max_skipped_steps", &s.max_skipped_steps, 1, std::numeric_limits<std::int64_t>::max());
  r.get_string("metrics", &s.metrics_path);
  r.get_string("trace", &s.trace_path);
  parse_offload_section(r.section("offload"), s);
  parse_parallel_section(r.section("parallel"), s);
  r.get_raw("tiling", &s.tiling);
  if (!s.tiling.is_object()) r.fail("tiling", "expected an object of per-layer tiling settings");
  r.finish();
  return s;
}

}  // namespace strata
