// What the training loop tells the user (see train/trainer_report.h).
#include "train/trainer_report.h"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <string_view>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "core/error.h"
#include "core/file_io.h"
#include "core/units.h"

namespace strata::train {
namespace {

// A "Field:   N kB" line of /proc/self/status, in bytes (0 when absent).
std::uint64_t proc_status_bytes(std::string_view field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.size() > field.size() && line.compare(0, field.size(), field) == 0 && line[field.size()] == ':') {
      return std::stoull(line.substr(field.size() + 1)) * 1024;
    }
  }
  return 0;
}
// The current resident set of this process (VmRSS).
std::uint64_t current_rss_bytes() { return proc_status_bytes("VmRSS"); }

// File descriptors this process has open: the entries of /proc/self/fd, less the one the listing
// itself holds; -1 where /proc cannot be read.
std::int64_t open_fd_count() {
  DIR* dir = ::opendir("/proc/self/fd");
  if (dir == nullptr) return -1;
  std::int64_t n = 0;
  while (const dirent* e = ::readdir(dir)) n += e->d_name[0] != '.' ? 1 : 0;
  ::closedir(dir);
  return n - 1;
}

// Bytes this rank's swap files take on disk (st_blocks x 512; the engine preallocates them, so this
// stays put while the run is healthy): the plan's swap file in each of its NVMe directories.
std::uint64_t swap_file_bytes(const RunPlan& plan) {
  std::uint64_t bytes = 0;
  for (const auto& d : plan.offload.nvme_dirs) {
    struct stat st {};
    const std::string path = d + "/" + plan.offload.swap_file_name;
    if (::stat(path.c_str(), &st) == 0) bytes += static_cast<std::uint64_t>(st.st_blocks) * 512;
  }
  return bytes;
}

std::string format_duration(double seconds) {
  if (!(seconds >= 0) || seconds > 1e7) return "?";
  const auto t = static_cast<long long>(seconds + 0.5);
  if (t >= 3600) return fmt::format("{}h{:02}m", t / 3600, (t / 60) % 60);
  if (t >= 60) return fmt::format("{}m{:02}s", t / 60, t % 60);
  return fmt::format("{}s", t);
}

// Two runs appending to one metrics file interleave their lines: the second is refused. A device
// or FIFO (/dev/stdout) is not locked: several writers of a stream are the user's choice.
RunLock lock_metrics(const TrainConfig& cfg, int rank) {
  const std::string& path = cfg.strata.metrics_path;
  if (rank != 0 || path.empty()) return {};
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) return {};
  return RunLock::acquire(path, "metrics file");
}

// Called with the metrics lock held: no other run renames or writes the file meanwhile.
std::unique_ptr<OutputFile> open_metrics(const TrainConfig& cfg, int rank, const std::string& resumed_from,
                                         std::int64_t first_step) {
  const std::string& path = cfg.strata.metrics_path;
  if (rank != 0 || path.empty()) return nullptr;
  struct stat st {};
  const bool earlier_lines = ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0;
  if (earlier_lines && resumed_from.empty()) {
    std::string kept;
    for (int n = 1;; ++n) {
      kept = fmt::format("{}.{}", path, n);
      struct stat other {};
      if (::lstat(kept.c_str(), &other) != 0) break;
    }
    rename_path(path, kept);
    spdlog::info("strata.metrics: {} held the lines of an earlier run; they are kept as {}, and this run starts the "
                 "file anew",
                 path, kept);
  }
  auto file = std::make_unique<OutputFile>(path, "strata.metrics", OutputFile::Mode::Append);
  if (earlier_lines && !resumed_from.empty()) {
    file->write(nlohmann::json{{"resumed", {{"step", first_step}, {"checkpoint", resumed_from}}}}.dump() + "\n");
  }
  return file;
}

}  // namespace

std::uint64_t peak_rss_bytes() { return proc_status_bytes("VmHWM"); }

ProgressBar::ProgressBar(std::int64_t total, bool enabled)
    : total_(total), interactive_(enabled && ::isatty(STDERR_FILENO) != 0) {}

void ProgressBar::update(std::int64_t done, const std::string& text) {
  constexpr int kWidth = 24;
  const int filled = total_ > 0 ? static_cast<int>(kWidth * done / total_) : kWidth;
  std::fprintf(stderr, "\r\033[K[%s%s] %lld/%lld %s", std::string(static_cast<std::size_t>(filled), '#').c_str(),
               std::string(static_cast<std::size_t>(kWidth - filled), '.').c_str(), static_cast<long long>(done),
               static_cast<long long>(total_), text.c_str());
  std::fflush(stderr);
  drawn_ = true;
}

void ProgressBar::finish() {
  if (drawn_) std::fprintf(stderr, "\n");
  drawn_ = false;
}

StepReporter::StepReporter(const TrainConfig& cfg, bool quiet, int rank, ZeroEngine& engine,
                           std::int64_t tokens_per_step, const std::string& resumed_from, std::int64_t first_step)
    : cfg_(cfg),
      quiet_(quiet),
      engine_(engine),
      tokens_per_step_(tokens_per_step),
      metrics_lock_(lock_metrics(cfg, rank)),
      metrics_(open_metrics(cfg, rank, resumed_from, first_step)),
      bar_(cfg.strata.steps, rank == 0 && !quiet) {}

void StepReporter::report(const StepFigures& f, std::int64_t s, double eta_seconds) {
  const TierIoStats& io = f.io;
  const std::uint64_t nvme_moved =
      (io.nvme_bytes_read - f.io_before.nvme_bytes_read) + (io.nvme_bytes_written - f.io_before.nvme_bytes_written);
  const double nvme_gbps = static_cast<double>(nvme_moved) / f.seconds / 1e9;
  const std::uint64_t host_bytes = io.host_bytes + engine_.pinned_pool_bytes();
  const double tok_s = static_cast<double>(tokens_per_step_) / f.seconds;
  std::string tiers = fmt::format("device {}", format_bytes(f.stats.allocated_bytes));
  if (engine_.optimizer_offloaded()) tiers += fmt::format(" | host {}", format_bytes(host_bytes));
  if (io.peak_nvme_bytes > 0) tiers += fmt::format(" | nvme {} {:.2f} GB/s", format_bytes(io.nvme_bytes), nvme_gbps);
  const std::string text = fmt::format("loss {:.4f}{} | {:.0f} tok/s | {} | ETA {}", f.loss,
                                       f.result.applied ? "" : " (skipped)", tok_s, tiers, format_duration(eta_seconds));
  if (bar_.interactive()) {
    bar_.update(s + 1, text);
  } else if (!quiet_ && (s % cfg_.steps_per_print == 0 || s + 1 == cfg_.strata.steps)) {
    spdlog::info("step {}/{} | {} | lr {:.3g} | grad norm {:.3f}", s + 1, cfg_.strata.steps, text, f.lr,
                 f.result.grad_norm);
  }
  if (metrics_) {
    try {
      write_metrics_line(f, s, host_bytes);
    } catch (const IoError& e) {
      metrics_failed(e);
    }
  }
}

void StepReporter::report_validation(std::int64_t step, const ValidationResult& v) {
  if (!quiet_) {
    bar_.finish();
    spdlog::info("step {}/{} | validation loss {:.4f} (perplexity {:.4g}) over {} tokens of {} windows, {:.2f} s", step,
                 cfg_.strata.steps, v.loss, std::exp(v.loss), v.tokens, v.windows, v.seconds);
  }
  if (!metrics_) return;
  try {
    metrics_->write(nlohmann::json{{"step", step},
                                   {"validation_loss", v.loss},
                                   {"validation_tokens", v.tokens},
                                   {"validation_seconds", v.seconds}}
                        .dump() +
                    "\n");
  } catch (const IoError& e) {
    metrics_failed(e);
  }
}

void StepReporter::finish() {
  bar_.finish();
  if (!metrics_) return;
  try {
    metrics_->close();
  } catch (const IoError& e) {
    metrics_failed(e);
  }
  metrics_.reset();
}

void StepReporter::metrics_failed(const IoError& e) {
  bar_.finish();
  spdlog::error("{}; no more metrics are written, training goes on, and the run will exit with this error", e.what());
  metrics_failure_ = e;
  metrics_.reset();
}

void StepReporter::write_metrics_line(const StepFigures& f, std::int64_t s, std::uint64_t host_bytes) {
  const TierIoStats& io = f.io;
  metrics_->write(nlohmann::json{{"step", s + 1},
                              {"loss", f.loss},
                              {"lr", f.lr},
                              {"grad_norm", f.result.grad_norm},
                              {"applied", f.result.applied},
                              {"loss_scale", f.result.loss_scale},
                              {"tokens", tokens_per_step_},
                              {"loss_tokens", f.counted_targets},
                              {"seconds", f.seconds},
                              {"step_call_seconds", f.exposed},
                              {"device_bytes", f.stats.allocated_bytes},
                              {"device_peak_bytes", f.stats.peak_allocated_bytes},
                              {"pageable_copies", f.pageable_copies()},
                              {"host_pins", f.pins()},
                              {"host_bytes", host_bytes},
                              {"nvme_bytes", io.nvme_bytes},
                              {"nvme_read_bytes", io.nvme_bytes_read - f.io_before.nvme_bytes_read},
                              {"nvme_written_bytes", io.nvme_bytes_written - f.io_before.nvme_bytes_written},
                              // Process resources, for soak runs (tests/tools/train_soak_test.sh).
                              {"rss_bytes", current_rss_bytes()},
                              {"open_fds", open_fd_count()},
                              {"swap_file_bytes", swap_file_bytes(engine_.plan())}}
                     .dump() +
                 "\n");
}

namespace {

nlohmann::json pipeline_json(const TrainSummary& s) {
  nlohmann::json stages = nlohmann::json::array();
  for (const TrainSummary::PipelineStageFigures& f : s.stages) {
    stages.push_back({{"first_layer", f.first_layer},
                      {"end_layer", f.end_layer},
                      {"parameters", f.parameters},
                      {"peak_in_flight", f.peak_in_flight},
                      {"stash_slots", f.stash_slots},
                      {"activation_sets", f.activation_sets},
                      {"activation_bytes", f.activation_bytes},
                      {"buffer_bytes", f.buffer_bytes},
                      {"peak_device_bytes", f.peak_device_bytes},
                      {"sent_bytes_per_micro_batch", f.sent_bytes},
                      {"received_bytes_per_micro_batch", f.received_bytes},
                      {"formula_sent_bytes_per_micro_batch", f.formula_sent_bytes},
                      {"formula_received_bytes_per_micro_batch", f.formula_received_bytes},
                      {"measured_bubble_fraction", f.measured_bubble}});
  }
  if (s.pipeline_stages <= 1) return nullptr;
  return {{"stages", s.pipeline_stages},
          {"schedule", s.pipeline_schedule},
          {"ideal_bubble_fraction", s.pipeline_ideal_bubble},
          {"per_stage", stages}};
}

nlohmann::json ranks_json(const TrainSummary& s) {
  nlohmann::json ranks = nlohmann::json::array();
  for (const TrainSummary::RankFigures& f : s.ranks) {
    ranks.push_back({{"rank", f.rank},
                     {"data", f.data},
                     {"tensor", f.tensor},
                     {"pipeline", f.pipeline},
                     {"model_state_bytes", f.model_state_bytes},
                     {"peak_device_bytes", f.peak_device_bytes},
                     {"tensor_calls_per_micro_batch", f.tensor_calls},
                     {"tensor_bytes_per_micro_batch", f.tensor_bytes},
                     {"formula_tensor_calls_per_micro_batch", f.formula_tensor_calls},
                     {"formula_tensor_bytes_per_micro_batch", f.formula_tensor_bytes},
                     {"sent_bytes_per_micro_batch", f.sent_bytes},
                     {"received_bytes_per_micro_batch", f.received_bytes},
                     {"formula_sent_bytes_per_micro_batch", f.formula_sent_bytes},
                     {"formula_received_bytes_per_micro_batch", f.formula_received_bytes}});
  }
  return ranks;
}

}  // namespace

void write_summary_json(const std::string& path, const TrainSummary& s) {
  OutputFile out(path, "--summary-json", OutputFile::Mode::Truncate);
  out.write(nlohmann::json{{"steps", s.steps},
                        {"first_loss", s.first_loss},
                        {"last_loss", s.last_loss},
                        {"validation_loss", s.validation_tokens > 0 ? nlohmann::json(s.validation_loss) : nlohmann::json()},
                        {"validation_tokens", s.validation_tokens},
                        {"validation_step", s.validation_step},
                        {"import_bytes", s.import_bytes},
                        {"import_peak_host_bytes", s.import_peak_host_bytes},
                        {"tokens_per_second", s.tokens_per_second},
                        {"peak_device_bytes", s.peak_device_bytes},
                        {"peak_host_bytes", s.peak_host_bytes},
                        {"pinned_bytes", s.pinned_bytes},
                        {"peak_rss_bytes", s.peak_rss_bytes},
                        {"peak_nvme_bytes", s.peak_nvme_bytes},
                        {"nvme_bytes_read", s.nvme_bytes_read},
                        {"nvme_bytes_written", s.nvme_bytes_written},
                        {"optimizer_chunk_updates", s.optimizer_chunk_updates},
                        {"overlapped_chunk_updates", s.overlapped_chunk_updates},
                        {"step_call_fraction", s.step_call_fraction},
                        {"model_state_bytes", s.model_state_bytes},
                        {"device_capacity_bytes", s.device_capacity_bytes},
                        {"device", s.device_name},
                        {"pageable_copies_per_step", s.step_pageable_copies},
                        {"host_pins_per_step", s.step_pins},
                        {"nvme_bytes_written_per_step", s.wear.bytes_per_step},
                        {"nvme_tb_written_per_day", s.wear.tb_per_day},
                        {"nvme_drives", s.drives},
                        {"drive_tbw", s.drive_tbw},
                        {"days_to_rated_endurance", s.wear.days_to_rated},
                        {"tensor_parallel",
                         {{"tensor_ranks", s.tensor_ranks},
                          {"per_micro_batch",
                           {{"all_reduce_calls", s.tp_all_reduce_calls},
                            {"all_reduce_bytes", s.tp_all_reduce_bytes},
                            {"all_gather_calls", s.tp_all_gather_calls},
                            {"all_gather_bytes", s.tp_all_gather_bytes},
                            {"reduce_scatter_calls", s.tp_reduce_scatter_calls},
                            {"reduce_scatter_bytes", s.tp_reduce_scatter_bytes},
                            {"norm_chain_calls", s.tp_chain_calls},
                            {"norm_chain_bytes", s.tp_chain_bytes}}},
                          {"formula_per_micro_batch",
                           {{"all_reduce_calls", s.tp_formula_all_reduce_calls},
                            {"all_reduce_bytes", s.tp_formula_all_reduce_bytes},
                            {"all_gather_calls", s.tp_formula_all_gather_calls},
                            {"all_gather_bytes", s.tp_formula_all_gather_bytes},
                            {"reduce_scatter_calls", s.tp_formula_reduce_scatter_calls},
                            {"reduce_scatter_bytes", s.tp_formula_reduce_scatter_bytes},
                            {"norm_chain_calls", s.tp_formula_chain_calls},
                            {"norm_chain_bytes", s.tp_formula_chain_bytes}}}}},
                        {"pipeline", pipeline_json(s)},
                        {"per_rank", ranks_json(s)}}
                .dump(2) +
            "\n");
  out.close();
}

std::string describe_wear(const TrainSummary& s) {
  const std::string rate = fmt::format("NVMe wear: {} written per step by all ranks = {:.3g} TB per day over {} drive(s)",
                                       format_bytes(static_cast<std::uint64_t>(s.wear.bytes_per_step)),
                                       s.wear.tb_per_day, s.drives);
  if (s.drive_tbw <= 0) return rate + "; give --drive-tbw (the drive's rated TBW) for the days to its rated endurance";
  return fmt::format("{}; rated {} TBW per drive: {:.0f} days of this training", rate, s.drive_tbw,
                     s.wear.days_to_rated);
}

void log_summary(const TrainSummary& summary, ZeroEngine& engine, const Device& device) {
  for (std::size_t p = 0; p < summary.stages.size(); ++p) {
    const TrainSummary::PipelineStageFigures& f = summary.stages[p];
    spdlog::info("pipeline stage {} (blocks {}..{}, {:.3g}M parameters): idle {} of its steps (ideal bubble {:.1f}%); "
                 "at most {} micro-batches in flight, {} activation sets in {}, stash and boundary buffers {}, peak "
                 "device memory {}; per micro-batch sent {} and received {} (formula {} and {})",
                 p, f.first_layer, f.end_layer - 1, static_cast<double>(f.parameters) / 1e6,
                 f.measured_bubble < 0 ? std::string("not measured") : fmt::format("{:.1f}%", 100 * f.measured_bubble),
                 100 * summary.pipeline_ideal_bubble, f.peak_in_flight, f.activation_sets,
                 format_bytes(f.activation_bytes), format_bytes(f.buffer_bytes), format_bytes(f.peak_device_bytes),
                 format_bytes(static_cast<std::uint64_t>(f.sent_bytes)),
                 format_bytes(static_cast<std::uint64_t>(f.received_bytes)),
                 format_bytes(static_cast<std::uint64_t>(f.formula_sent_bytes)),
                 format_bytes(static_cast<std::uint64_t>(f.formula_received_bytes)));
  }
  if (summary.tensor_ranks > 1 || summary.pipeline_stages > 1) {
    for (const TrainSummary::RankFigures& f : summary.ranks) {
      spdlog::info("rank {} (data {}, tensor {}, stage {}): model state {}, peak device {}; per micro-batch tensor group "
                   "{:.0f} collectives, {} (formula {}, {}), stage sent {} and received {} (formula {} and {})",
                   f.rank, f.data, f.tensor, f.pipeline, format_bytes(f.model_state_bytes),
                   format_bytes(f.peak_device_bytes), f.tensor_calls,
                   format_bytes(static_cast<std::uint64_t>(f.tensor_bytes)), f.formula_tensor_calls,
                   format_bytes(static_cast<std::uint64_t>(f.formula_tensor_bytes)),
                   format_bytes(static_cast<std::uint64_t>(f.sent_bytes)),
                   format_bytes(static_cast<std::uint64_t>(f.received_bytes)),
                   format_bytes(static_cast<std::uint64_t>(f.formula_sent_bytes)),
                   format_bytes(static_cast<std::uint64_t>(f.formula_received_bytes)));
    }
  }
  spdlog::info("done: {} steps, loss {:.4f} -> {:.4f}, {:.0f} tokens/s, peak device memory {} of {}", summary.steps,
               summary.first_loss, summary.last_loss, summary.tokens_per_second,
               format_bytes(summary.peak_device_bytes), format_bytes(device.capacity_bytes()));
  spdlog::debug("{}", format_memory_report(device.name(), device.memory_stats()));  // peak per tag
  if (summary.tensor_ranks > 1) {
    const TrainSummary& s = summary;
    spdlog::info("tensor group of {}: per micro-batch {:.0f} all-reduces of {} and {:.0f} all-gather of {} per rank "
                 "(Megatron's count: {} all-reduces of {}, {} all-gather of {})",
                 s.tensor_ranks, s.tp_all_reduce_calls, format_bytes(static_cast<std::uint64_t>(s.tp_all_reduce_bytes)),
                 s.tp_all_gather_calls, format_bytes(static_cast<std::uint64_t>(s.tp_all_gather_bytes)),
                 s.tp_formula_all_reduce_calls, format_bytes(s.tp_formula_all_reduce_bytes),
                 s.tp_formula_all_gather_calls, format_bytes(s.tp_formula_all_gather_bytes));
    if (s.tp_reduce_scatter_calls > 0 || s.tp_formula_reduce_scatter_calls > 0) {
      spdlog::info("sequence parallelism: per micro-batch {:.0f} reduce-scatters of {} and {:.0f} sends, receives and "
                   "broadcasts of norm gradients, {} (formula: {} of {} and {}, {})",
                   s.tp_reduce_scatter_calls, format_bytes(static_cast<std::uint64_t>(s.tp_reduce_scatter_bytes)),
                   s.tp_chain_calls, format_bytes(static_cast<std::uint64_t>(s.tp_chain_bytes)),
                   s.tp_formula_reduce_scatter_calls, format_bytes(s.tp_formula_reduce_scatter_bytes),
                   s.tp_formula_chain_calls, format_bytes(s.tp_formula_chain_bytes));
    }
  }
  if (engine.optimizer_offloaded()) {
    spdlog::info("tiers: peak host {} (pinned staging {}; process peak RSS {}), peak nvme {}; nvme read {}, written {}",
                 format_bytes(summary.peak_host_bytes), format_bytes(engine.pinned_pool_bytes()),
                 format_bytes(summary.peak_rss_bytes),
                 format_bytes(summary.peak_nvme_bytes), format_bytes(summary.nvme_bytes_read),
                 format_bytes(summary.nvme_bytes_written));
    if (summary.wear.bytes_per_step > 0) spdlog::info("{}", describe_wear(summary));
    spdlog::info("overlap: {} of {} optimizer chunk updates ran during backward; step() (exposed reductions and "
                 "updates) took {:.0f}% of the step time",
                 summary.overlapped_chunk_updates, summary.optimizer_chunk_updates,
                 100.0 * summary.step_call_fraction);
  }
}

}  // namespace strata::train
