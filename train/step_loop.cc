// The step loop (see train/step_loop.h).
#include "train/step_loop.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <exception>
#include <span>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "core/error.h"
#include "core/log.h"
#include "core/units.h"
#include "config/lr_schedule.h"
#include "plan/machine.h"

namespace strata::train {
namespace {

// The targets of step s that count toward the loss, over every micro-batch of every data rank (Note
// [Loss mask] in models/token_data.h): every rank draws the same windows, so every rank gets the
// same count without a collective. Without a loss mask, every target counts.
std::int64_t step_target_count(StepLoop& l, std::int64_t s) {
  if (!l.masked) return l.tokens_per_step;
  std::int64_t counted = 0;
  for (std::int64_t unit = 0; unit < l.units; ++unit) {
    l.sampler.restore(models::SamplerState{l.seed, static_cast<std::uint64_t>((s * l.units + unit) * l.micro)});
    counted += l.sampler.counted_targets();
  }
  return counted;
}

// d(step loss)/d(per-token loss) as the micro-batches' loss gradient starts: 1 / (targets counted in
// the step) times the units, which the engine's step divides out again (grad_scale = 1 / units), and
// times the fp16 loss scale (1 otherwise; divided out too). Float products of whole numbers below
// 2^24 are exact, so without a mask this is the rounded 1 / (micro * seq) of every unit. A step with
// no counted target has no gradient: seed 0 (Note [Loss mask] in models/token_data.h).
float loss_gradient_seed(const StepLoop& l, std::int64_t counted) {
  if (counted == 0) return 0.0f;
  const float scaled_units = static_cast<float>(l.engine.loss_scale()) * static_cast<float>(l.units);
  return scaled_units / static_cast<float>(counted);
}

// The micro-batches of step s through this rank's pipeline stage; returns the sum of their
// per-token losses (the last stage's, on every stage).
double run_pipeline_micro_batches(StepLoop& l, std::int64_t s, float grad_seed) {
  const auto fill = [&](int a, std::int32_t* tokens, std::int32_t* targets) {
    const std::int64_t unit = static_cast<std::int64_t>(a) * l.world + l.rank;
    l.sampler.restore(models::SamplerState{l.seed, static_cast<std::uint64_t>((s * l.units + unit) * l.micro)});
    l.sampler.next(tokens, targets);
  };
  const std::vector<models::LossSum> losses = l.pipeline->run_step(
      l.engine, fill, grad_seed, [&](int) { l.engine.begin_micro_batch(); }, [&](int) { l.engine.end_micro_batch(); });
  double loss_sum = 0;
  for (const models::LossSum& loss : losses) loss_sum += loss.sum;
  if (s > l.first_step) {  // the first step warms up (allocations, the prefetch trace)
    l.pipeline_busy_ms += l.pipeline->last_step().busy_ms;
    l.pipeline_span_ms += l.pipeline->last_step().span_ms;
  }
  const bool last = l.pipeline_comm->rank() + 1 == l.pipeline_comm->world_size();
  return l.pipeline_comm->all_reduce_host(last ? loss_sum : 0.0, ReduceOp::Sum);
}

// The micro-batches of step s on this rank, their loss gradient seeded with grad_seed
// (loss_gradient_seed); returns the sum of their per-token losses.
double run_micro_batches(StepLoop& l, std::int64_t s, float grad_seed) {
  if (l.pipeline != nullptr) return run_pipeline_micro_batches(l, s, grad_seed);
  double loss_sum = 0;
  for (int a = 0; a < l.accumulation; ++a) {
    const std::int64_t unit = static_cast<std::int64_t>(a) * l.world + l.rank;
    l.sampler.restore(models::SamplerState{l.seed, static_cast<std::uint64_t>((s * l.units + unit) * l.micro)});
    l.sampler.next(l.inputs.data(), l.targets.data());
    l.engine.begin_micro_batch();
    const models::LossSum loss = l.decoder.forward_backward(l.rt, l.engine, l.inputs.data(), l.targets.data(), l.micro,
                                                            l.seq, grad_seed);
    l.engine.end_micro_batch();
    loss_sum += loss.sum;
  }
  return loss_sum;
}

// Step s (from 0): the checkpoint begun before it, the learning rate, the micro-batches, step(lr)
// and the step's loss: the mean over the targets it counted on all ranks (Note [Loss mask] in models/token_data.h).
StepFigures run_step(StepLoop& l, std::int64_t s) {
  StepFigures f;
  const auto step_start = Clock::now();
  f.io_before = l.engine.tier_stats();
  f.copy_before = l.engine.offload_copy_bytes();
  const MemoryStats before = l.device.memory_stats();
  f.pageable_before = before.pageable_copies;
  f.pins_before = before.host_pins;
  l.checkpoints.before_step(l.engine, s + 1, s + 1 == l.cfg.strata.steps);
  f.lr = lr_for_step(l.cfg.scheduler, l.cfg.optimizer.lr, s);
  l.engine.prepare_step(f.lr);
  f.counted_targets = step_target_count(l, s);
  if (f.counted_targets == 0 && l.reports) {
    spdlog::warn("step {}: the loss mask masks every target of the step's {} windows: no gradient, loss reported as 0",
                 s + 1, l.units * l.micro);
  }
  const double loss_sum = run_micro_batches(l, s, loss_gradient_seed(l, f.counted_targets));
  const auto step_call = Clock::now();
  f.result = l.engine.step(f.lr);
  f.exposed = std::chrono::duration<double>(Clock::now() - step_call).count();
  const double all_ranks_sum = l.comm.all_reduce_host(loss_sum, ReduceOp::Sum);
  f.loss = f.counted_targets > 0 ? all_ranks_sum / static_cast<double>(f.counted_targets) : 0.0;
  f.seconds = std::chrono::duration<double>(Clock::now() - step_start).count();
  f.stats = l.device.memory_stats();
  f.io = l.engine.tier_stats();
  return f;
}

// Adds step s to the summary.
void record_step(TrainSummary& summary, const StepFigures& f, std::int64_t s, std::int64_t first_step,
                 ZeroEngine& engine) {
  const TierIoStats& io = f.io;
  if (s == first_step) summary.first_loss = f.loss;
  summary.last_loss = f.loss;
  summary.steps = s + 1;
  summary.peak_device_bytes = std::max(summary.peak_device_bytes, f.stats.peak_allocated_bytes);
  summary.peak_host_bytes = std::max<std::uint64_t>(summary.peak_host_bytes, io.peak_host_bytes + engine.pinned_pool_bytes());
  summary.peak_nvme_bytes = std::max(summary.peak_nvme_bytes, io.peak_nvme_bytes);
  summary.nvme_bytes_read = io.nvme_bytes_read;
  summary.nvme_bytes_written = io.nvme_bytes_written;
  summary.step_seconds.push_back(f.seconds);
  summary.step_nvme_read.push_back(io.nvme_bytes_read - f.io_before.nvme_bytes_read);
  summary.step_nvme_written.push_back(io.nvme_bytes_written - f.io_before.nvme_bytes_written);
  summary.step_copy_bytes.push_back(engine.offload_copy_bytes() - f.copy_before);
  summary.step_pageable_copies.push_back(f.pageable_copies());
  summary.step_pins.push_back(f.pins());
}


// Step s (from 0) was the `skipped`-th skipped step in a row; past strata.max_skipped_steps the run
// is not training, and fails saying why. Every rank sees the same skips, so every rank stops here.
void check_skipped_steps(const TrainConfig& cfg, const StepFigures& f, std::int64_t s, std::int64_t skipped) {
  if (skipped < cfg.strata.max_skipped_steps) return;
  const std::string scale = cfg.precision == Precision::Fp16 ? fmt::format(", fp16 loss scale {:.4g}", f.result.loss_scale)
                                                             : std::string();
  throw SkippedStepsError(fmt::format(
      "{}: step {}: {} steps in a row were skipped because the gradients were not finite (grad norm {:.4g}, loss "
      "{:.4f}{}); "
      "the run is not training. Lower optimizer.params.lr, set gradient_clipping, check strata.init_weights and the "
      "data, or raise strata.max_skipped_steps (now {})",
      cfg.source, s + 1, skipped, f.result.grad_norm, f.loss, scale, cfg.strata.max_skipped_steps));
}

// A rank that fails inside a step of a job of several ranks ends the job: the other ranks wait for
// its part of a collective or its pipeline messages, and unwinding here would wait on streams whose
// work waits for them (the engine's reductions, a pipeline stage's sends). Say what failed (as main
// would) and end the process; mpirun then ends the job. The last checkpoint stays as it was.
[[noreturn]] void end_job_after_failure(const std::exception& e, const Communicator& comm, std::int64_t s) {
  const bool bad_input = dynamic_cast<const Error*>(&e) != nullptr && dynamic_cast<const InternalError*>(&e) == nullptr;
  spdlog::default_logger()->flush();
  std::fprintf(stderr, "strata: %s: %s (rank %d of %d failed in step %lld: ending the job, whose other ranks wait for "
               "its messages)\n",
               bad_input ? "error" : "internal error", e.what(), comm.rank(), comm.world_size(),
               static_cast<long long>(s + 1));
  std::fflush(stderr);
  std::_Exit(bad_input ? 1 : 2);
}

}  // namespace

// The steps from first_step on, until the last or a stop signal; fills `summary` step by step.
LoopSeconds run_steps(StepLoop& l, std::int64_t first_step, TrainSummary& summary) {
  LoopSeconds total;
  std::int64_t skipped_in_a_row = 0;
  for (std::int64_t s = first_step; s < l.cfg.strata.steps; ++s) {
    StepFigures f;
    try {
      f = run_step(l, s);
    } catch (const std::exception& e) {
      if (l.world_comm.world_size() > 1) end_job_after_failure(e, l.world_comm, s);
      throw;
    }
    total.steps += f.seconds;
    total.exposed += f.exposed;
    record_step(summary, f, s, first_step, l.engine);
    if (l.reports) {
      const double eta = total.steps / static_cast<double>(s + 1 - first_step) *
                         static_cast<double>(l.cfg.strata.steps - s - 1);
      l.reporter.report(f, s, eta);
    }
    skipped_in_a_row = f.result.applied ? 0 : skipped_in_a_row + 1;
    check_skipped_steps(l.cfg, f, s, skipped_in_a_row);
    if (l.validation != nullptr && l.validation->due(s + 1)) {
      ValidationResult v;
      try {
        v = l.validation->evaluate(l.engine, l.decoder, l.rt, l.comm, l.micro);
      } catch (const std::exception& e) {
        if (l.world_comm.world_size() > 1) end_job_after_failure(e, l.world_comm, s);
        throw;
      }
      total.validation += v.seconds;
      summary.validation_loss = v.loss;
      summary.validation_tokens = v.tokens;
      summary.validation_step = s + 1;
      if (l.reports) l.reporter.report_validation(s + 1, v);
    }
    summary.stopped_by_signal = l.checkpoints.after_step(l.engine, s + 1, s + 1 == l.cfg.strata.steps);
    if (summary.stopped_by_signal != 0) break;
  }
  return total;
}

void wear_summary(TrainSummary& summary, const TierPlan& plan, int world, double drive_tbw) {
  const std::size_t n = summary.step_nvme_written.size();
  summary.drives = static_cast<int>(plan.nvme_dirs.size());
  summary.drive_tbw = drive_tbw;
  if (n == 0 || summary.step_seconds.size() != n) return;
  const std::size_t first = n > 1 ? 1 : 0;
  double bytes = 0, seconds = 0;
  for (std::size_t i = first; i < n; ++i) {
    bytes += static_cast<double>(summary.step_nvme_written[i]);
    seconds += summary.step_seconds[i];
  }
  const double steps = static_cast<double>(n - first);
  if (seconds <= 0) return;
  summary.wear = ssd_wear(bytes / steps * world, seconds / steps, summary.drives, drive_tbw);
}

void total_summary(TrainSummary& summary, const StepLoop& l, const LoopSeconds& seconds, const TierPlan& plan,
                   const models::ModelConfig& model, Clock::time_point start, std::int64_t first_step) {
  summary.optimizer_chunk_updates = l.engine.chunk_updates();
  summary.overlapped_chunk_updates = l.engine.overlapped_chunk_updates();
  summary.step_call_fraction = seconds.steps > 0 ? seconds.exposed / seconds.steps : 0;
  summary.pinned_bytes = l.engine.pinned_pool_bytes();
  summary.optimizer_offloaded = l.engine.optimizer_offloaded();
  summary.model_state_bytes = plan.model_state;
  summary.parameters = static_cast<std::uint64_t>(models::param_count(model));
  summary.device_capacity_bytes = l.device.capacity_bytes();
  summary.device_name = l.device.name();
  summary.tokens_per_step = l.tokens_per_step;
  const double elapsed = std::chrono::duration<double>(Clock::now() - start).count() - seconds.validation;
  const std::int64_t steps_run = std::max<std::int64_t>(0, summary.steps - first_step);
  summary.tokens_per_second = elapsed > 0 ? static_cast<double>(l.tokens_per_step * steps_run) / elapsed : 0;
}

}  // namespace strata::train
