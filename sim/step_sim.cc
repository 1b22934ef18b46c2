// The step simulator's model of the engine (sim/step_sim.h, Note [Step simulator] in sim/step_sim.h): the
// parameter fetcher, the gradient reducer and the two state homes, replaying on a Timeline what
// engine/param_fetcher.cc, engine/grad_reducer.cc, engine/state_home_device.cc and
// engine/state_home_tiered.cc enqueue, with the durations the machine gives.
#include "sim/step_sim.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "core/error.h"
#include "engine/chunk_fields.h"
#include "engine/engine_context.h"
#include "plan/part_bytes.h"
#include "sim/step_sim_engine.h"

namespace strata::sim {
namespace detail {

Rates rates_of(const SimMachine& m, int ranks, const RunPlan& plan) {
  const MachineSpec& s = m.spec;
  const double share = 1.0 / ranks;
  Rates r;
  r.flops = s.gpus.bf16_tflops * 1e12;
  r.block_eff = m.block_efficiency;
  r.head_eff = m.head_efficiency;
  r.link = s.gpus.link_gbps * kGiga;
  r.device_memory = m.device_memory_gbps * kGiga;
  r.host_memory = s.host.memory_gbps * kGiga * share;
  r.adam = s.host.adam_params_per_s * share;
  // NVMe transfers take the drives' seconds at their own requests and depth (Note [Drive curves] in plan/machine_curve.h).
  r.io.drives = drive_model(s.drives, ranks, plan);
  r.io.h2d_bytes_per_s = s.gpus.pcie_h2d_gbps * kGiga;
  r.io.d2h_bytes_per_s = s.gpus.pcie_d2h_gbps * kGiga;
  return r;
}

void check_machine(const StepWorkload& w, const SimMachine& m) {
  const MachineSpec& s = m.spec;
  const std::string where = s.source.empty() ? s.name : s.source;
  auto need = [&](bool ok, const char* field, const std::string& why) {
    if (!ok) throw ConfigError(fmt::format("machine {}: {} must be > 0 to simulate {}: {}", where, field, w.source, why));
  };
  need(s.gpus.bf16_tflops > 0, "gpus.bf16_tflops", "the model's ops run at it");
  need(m.block_efficiency > 0 && m.head_efficiency > 0, "the compute efficiency", "ops run at peak x efficiency");
  need(m.device_memory_gbps > 0, "the device memory bandwidth", "device-side sums and copies run at it");
  STRATA_CHECK(m.wake_seconds >= 0 && std::isfinite(m.wake_seconds), "machine {}: a wake-up of {} s", where,
               m.wake_seconds);
  const RunPlan& p = w.plan;
  bool nvme = p.state_on_nvme() || p.grads_on_nvme();
  for (std::size_t g = 0; g < p.groups.size(); ++g) nvme = nvme || p.params_on_nvme(g);
  need(!nvme || s.drives.count > 0, "drives.count", "the config puts state on NVMe");
  need(!nvme || (s.drives.read_gbps > 0 && s.drives.write_gbps > 0), "drives.read_gbps and drives.write_gbps",
       "the config puts state on NVMe");
  need(!p.optimizer_offloaded() || s.host.adam_params_per_s > 0, "host.adam_params_per_s",
       "the optimizer runs on the CPU");
  need(!p.optimizer_offloaded() || s.host.memory_gbps > 0, "host.memory_gbps", "gradient sums run on the CPU");
  need(!(p.optimizer_offloaded() || p.params_offloaded()) || (s.gpus.pcie_h2d_gbps > 0 && s.gpus.pcie_d2h_gbps > 0),
       "gpus.pcie_h2d_gbps and gpus.pcie_d2h_gbps", "offloaded state crosses PCIe");
  need(p.topo.world_size * w.tensor_ranks == 1 || s.gpus.link_gbps > 0, "gpus.link_gbps",
       fmt::format("{} GPUs reduce and gather over it", p.topo.world_size * w.tensor_ranks));
  need(!w.stage.split() || s.gpus.link_gbps > 0, "gpus.link_gbps",
       fmt::format("{} pipeline stages send activations and their gradients over it", w.stage.stages));
}

Timeline machine_timeline(const SimMachine& m) {
  std::array<SimQueue, kSimQueues> shared{SimQueue::Compute, SimQueue::H2D,  SimQueue::D2H,
                                          SimQueue::Collective, SimQueue::Nvme, SimQueue::Cpu};
  if (m.device_is_host) shared[static_cast<std::size_t>(SimQueue::Cpu)] = SimQueue::Compute;
  return Timeline(shared, m.wake_seconds);
}

SimResult step_result(const Timeline& timeline, double from, double to, std::int64_t tokens_per_step) {
  SimResult r;
  r.step_seconds = to - from;
  r.tokens_per_second = r.step_seconds > 0 ? static_cast<double>(tokens_per_step) / r.step_seconds : 0;
  for (std::size_t q = 0; q < kSimQueues; ++q) {
    r.busy_seconds[q] = timeline.busy_seconds(static_cast<SimQueue>(q), from, to);
    if (r.busy_seconds[q] > r.lower_bound_seconds) {
      r.lower_bound_seconds = r.busy_seconds[q];
      r.slowest = static_cast<SimQueue>(q);
    }
  }
  for (const SimOp& op : timeline.ops()) {
    if (op.end <= from || op.begin >= to || (op.end == op.begin && op.begin == from)) continue;
    SimOp o = op;
    o.begin = std::max(op.begin, from) - from;
    o.end = std::min(op.end, to) - from;
    if (o.queue == SimQueue::Nvme) {
      (o.name.rfind("nvme write", 0) == 0 ? r.nvme_written_bytes : r.nvme_read_bytes) += o.bytes;
    }
    r.ops.push_back(std::move(o));
  }
  return r;
}


// The ParamFetcher's trace: every acquisition of a step in the order the decoder makes them (a
// pipeline stage's: the tied embedding's share at the step's start, then its schedule's forwards
// and backwards).
void EngineSim::build_trace() {
  const auto add = [&](std::span<const SimAction> actions) {
    for (const SimAction& act : actions) {
      if (act.kind == SimAction::Acquire) trace_.push_back(act.group);
    }
  };
  const StageWork& S = w_.stage;
  if (!S.split()) {
    for (int a = 0; a < w_.micro_batches; ++a) add(w_.micro_batch);
    return;
  }
  add(S.share_tied);
  for (const models::PipelineOp& op : S.ops) add(op.forward ? S.forward(w_) : S.backward(w_));
}

double EngineSim::run_step() {
  for (int a = 0; a < w_.micro_batches; ++a) {
    run_actions(w_.micro_batch, a);
    synchronize_compute();  // the micro-batch's loss is read back
  }
  wait_for_gradients();
  update();
  return host_;
}

void EngineSim::run_actions(std::span<const SimAction> actions, int unit) {
  for (const SimAction& act : actions) dispatch(act, unit);
}

// step() waits for every reduction and gradient sum (the norm needs them), then updates what was
// not overlapped.
void EngineSim::wait_for_gradients() {
  host_wait(std::max(tl_.lane_end(SimLane::Comm), tl_.lane_end(SimLane::Worker)));
}

void EngineSim::update() {
  if (p_.optimizer_offloaded()) {
    if (!w_.overlap_update) {
      host_ = simulate_pipeline(tl_, SimLane::Host, host_, update_jobs(), p_.offload.slot_count, r_.io);
    }
  } else {
    norm_on_device();
    end_step_on_device();
  }
  // ParamFetcher::end_step: gathered copies freed, the next step's first groups fetched.
  for (Group& G : groups_) G.gathered = false;
  live_elems_ = 0;
  pos_ = 0;
  prefetch_after(0);
}

void EngineSim::dispatch(const SimAction& act, int unit) {
  switch (act.kind) {
    case SimAction::Acquire: acquire(act.group); break;
    case SimAction::Release: release(act.group); break;
    case SimAction::GradsReady: reduce(act.group, unit); break;
    case SimAction::Compute: {
      const double eff = act.cls == ComputeClass::Block ? r_.block_eff : r_.head_eff;
      const double seconds = transfer_seconds(act.flops, r_.flops * eff);
      last_compute_ = tl_.add(act.name, SimLane::Compute, SimQueue::Compute, seconds, std::max(host_, compute_wait_));
      break;
    }
    case SimAction::TensorCollective: {  // a ring over the tensor group, in the compute stream's order
      const int T = w_.tensor_ranks;
      const double seconds = act.passes * (T - 1) / T * transfer_seconds(act.bytes, r_.link);
      last_compute_ = tl_.add(act.name, SimLane::Compute, SimQueue::Collective, seconds, std::max(host_, compute_wait_),
                              static_cast<std::uint64_t>(act.bytes));
      break;
    }
  }
}

// ParamFetcher::acquire with a valid trace.
void EngineSim::acquire(std::size_t g) {
  ++pos_;
  Group& G = groups_[g];
  ++G.live;
  if (!plan(g).sharded_params) {
    compute_wait_ = std::max(compute_wait_, published_);
    return;
  }
  if (!G.gathered) start_gather(g);
  compute_wait_ = std::max(compute_wait_, G.gathered_at);
  prefetch_after(pos_);
}

// ParamFetcher::release: a gathered group needed again inside the prefetch window stays.
void EngineSim::release(std::size_t g) {
  Group& G = groups_[g];
  if (--G.live > 0 || !plan(g).sharded_params) return;
  std::uint64_t window = 0;
  for (std::size_t i = pos_; i < trace_.size(); ++i) {
    if (trace_[i] == g) return;
    window += plan(trace_[i]).layout.total_elems();
    if (window > w_.prefetch_bucket_elems) break;
  }
  G.gathered = false;
  live_elems_ -= plan(g).layout.total_elems();
}

void EngineSim::prefetch_after(std::size_t position) {
  std::uint64_t ahead = 0;
  for (std::size_t i = position; i < trace_.size(); ++i) {
    const std::size_t g = trace_[i];
    if (!plan(g).sharded_params || groups_[g].gathered) continue;
    const std::uint64_t total = plan(g).layout.total_elems();
    if (ahead + total > w_.prefetch_bucket_elems || live_elems_ + total > w_.max_live_elems) break;
    start_gather(g);
    ahead += total;
  }
}

// ParamFetcher::start_gather: the shard from the device, host or NVMe (through a pinned slot that
// the host waits for, and reads the host waits for: Note [Host-driven offload] in docs/DESIGN.md), up to the device
// on the comm stream, then all-gathered.
void EngineSim::start_gather(std::size_t g) {
  const GroupLayout& L = plan(g).layout;
  // The engine's sizes (see Note [Part bytes] in plan/part_bytes.h).
  const auto shard_bytes = static_cast<double>(tier_shard_bytes(p_, g));
  const auto full_bytes = static_cast<double>(gathered_bytes(p_, g));
  double end = host_;
  if (p_.params_offloaded()) {
    double ready = host_;
    const bool spilled = p_.params_on_nvme(g);  // some chunks come from NVMe through a pinned slot
    if (spilled) {
      double nvme_bytes = 0, requests = 0;
      for (const StateChunk& c : plan(g).chunks) {
        if (c.params != Home::Nvme) continue;
        nvme_bytes += c.elems * wbytes();
        requests += r_.io.drives.key_requests(DriveOp::Read, c.elems * p_.working_bytes());
      }
      const std::size_t k = param_slot_back_.size(), slots = std::max<std::size_t>(p_.offload.param_slot_count, 1);
      if (k >= slots) host_wait(param_slot_back_[k - slots]);  // reserve_param_slot waits
      ready = tl_.add("nvme read params " + gname(g), SimLane::Io, SimQueue::Nvme,
                      r_.io.drives.seconds(DriveOp::Read, nvme_bytes, requests, 1), host_,
                      static_cast<std::uint64_t>(nvme_bytes));
      host_wait(ready);  // upload_params: the host waits for the reads, then enqueues the copies up
    }
    end = comm("h2d params " + gname(g), transfer_seconds(shard_bytes, r_.io.h2d_bytes_per_s), ready, shard_bytes,
               SimQueue::H2D);
    if (spilled) param_slot_back_.push_back(end);
    if (L.shard_count() > 1) {
      end = collective("all_gather " + gname(g), L.shard_count(), full_bytes, 1, end);
    }
  } else {
    end = collective("all_gather " + gname(g), L.shard_count(), full_bytes, 1, host_);
  }
  Group& G = groups_[g];
  G.gathered = true;
  G.gathered_at = end;
  live_elems_ += L.total_elems();
}

// GradReducer::reduce as soon as the group's gradients are ready: reduce-scatter inside the shard
// group and all-reduce across replicas at stages 2-3, all-reduce at stages 0-1.
void EngineSim::reduce(std::size_t g, int unit) {
  const GroupPlan& P = plan(g);
  const auto full_bytes = static_cast<double>(unit_grad_bytes(p_, g));
  const auto grad_bytes = static_cast<double>(reduced_unit_bytes(p_, g));
  const double ready = last_compute_;
  double end = 0;
  if (p_.stage >= 2) {
    end = collective("reduce_scatter " + gname(g), P.layout.shard_count(), full_bytes, 1, ready);
    if (p_.topo.replica_count() > 1) {
      end = collective("all_reduce " + gname(g), p_.topo.replica_count(), grad_bytes, 2, end);
    }
  } else {
    end = collective("all_reduce " + gname(g), p_.topo.world_size, full_bytes, 2, ready);
  }
  end = add_unit(g, unit, end);
  // See Note [Reductions in flight] in engine/grad_reducer.cc.
  // Unless the gradients are in place, the next group's micro-batch
  // buffer waits until fewer than kReductionsInFlight reductions are queued (the host blocks, as the
  // engine's does).
  if (p_.gradients_in_place()) return;
  in_flight_.push_back(end);
  while (in_flight_.size() >= kReductionsInFlight) {
    host_wait(in_flight_.front());
    in_flight_.pop_front();
  }
}

// StateHome::add_unit: on the device, one pass that widens the unit and adds it into the fp32 sum;
// on host/NVMe, the worker's chunk pipeline over the group (TieredStateHome::combine).
double EngineSim::add_unit(std::size_t g, int unit, double reduced_at) {
  const GroupPlan& P = plan(g);
  if (!p_.optimizer_offloaded()) {
    if (p_.accumulation == 1) return reduced_at;  // the norm and the update read the unit as it is
    const double bytes = static_cast<double>(P.grad_elems) * (wbytes() + 8);
    return comm("gradient sum " + gname(g), device_pass(bytes), reduced_at, bytes, SimQueue::Compute);
  }
  // The offload host thread takes the unit from here (it waits on the reduction's event); the comm
  // stream is done with it.
  simulate_pipeline(tl_, SimLane::Worker, reduced_at, combine_jobs(g, unit), p_.offload.slot_count, r_.io);
  return reduced_at;
}

// TieredStateHome::combine_job's arrays and work for chunk k of group g, unit `unit`: the unit
// comes down (d2h), is widened and added to the partial sums read from the optimizer's tier
// (the binary counter's levels in exact mode, one accumulator otherwise), and the result written
// back; at the last unit the block sums of squares, and with an overlapped update the update itself.
std::vector<PipelineJob> EngineSim::combine_jobs(std::size_t g, int unit) const {
  const GroupPlan& P = plan(g);
  const bool last = unit + 1 == w_.micro_batches;
  const bool overlap = last && w_.overlap_update;
  int reads = 0;  // fp32 partial sums of the chunk the pass reads
  if (w_.exact) {
    const int merges = counter_merges(unit);
    reads = merges + (last ? static_cast<int>(counter_levels_left(w_.micro_batches, merges).size()) : 0);
  } else {
    reads = unit > 0 ? 1 : 0;
  }
  std::vector<PipelineJob> jobs;
  for (std::size_t k = 0; k < P.chunks.size(); ++k) {
    const double n = static_cast<double>(P.chunks[k].elems);
    PipelineJob j;
    j.name = fmt::format("sum {}.{} unit {}", gname(g), k, unit);
    j.d2h_bytes = static_cast<std::uint64_t>(n * wbytes());
    // The pass: the unit read, the widened copy written, each partial read, the sum written.
    j.cpu_seconds = host_pass(n * wbytes() + 4 * n * (reads + 2)) + (last ? host_pass(4 * n) : 0);
    if (overlap) {
      j.cpu_seconds += adam(n);
      if (!weights_on_tier(g)) j.h2d_bytes = static_cast<std::uint64_t>(n * wbytes());
    }
    add_nvme(j, combine_fields(p_, g, k, unit, w_.exact, w_.overlap_update).fields);
    jobs.push_back(std::move(j));
  }
  return jobs;
}

// A job's NVMe bytes and kernel requests: the arrays the engine's job names (engine/chunk_fields.h),
// the ones on NVMe read before it runs (Read, Update) and written after (Update, Write).
void EngineSim::add_nvme(PipelineJob& job, std::span<const ChunkField> fields) const {
  for (const ChunkField& f : fields) {
    if (f.tier != Home::Nvme || f.kind == ChunkField::Scratch) continue;
    if (f.kind != ChunkField::Write) {
      job.nvme_read_bytes += f.bytes;
      job.nvme_read_requests += r_.io.drives.key_requests(DriveOp::Read, f.bytes);
    }
    if (f.kind != ChunkField::Read) {
      job.nvme_write_bytes += f.bytes;
      job.nvme_write_requests += r_.io.drives.key_requests(DriveOp::Write, f.bytes);
    }
  }
}

// TieredStateHome::update: every chunk's state and final gradient read, the CPU optimizer, the
// state written back and the new W written to the parameter tier or copied up to the device.
std::vector<PipelineJob> EngineSim::update_jobs() const {
  std::vector<PipelineJob> jobs;
  for (std::size_t g = 0; g < p_.groups.size(); ++g) {
    for (std::size_t k = 0; k < plan(g).chunks.size(); ++k) {
      const double n = static_cast<double>(plan(g).chunks[k].elems);
      PipelineJob j;
      j.name = fmt::format("update {}.{}", gname(g), k);
      j.cpu_seconds = adam(n);
      if (!weights_on_tier(g)) j.h2d_bytes = static_cast<std::uint64_t>(n * wbytes());
      add_nvme(j, update_fields(p_, g, k).fields);
      jobs.push_back(std::move(j));
    }
  }
  return jobs;
}

// DeviceStateHome::finish_grads: every group's norm part in one pass over the final gradients
// (RunPlan::final_grad_dtype) into the norm's partials, waited for once (Note [One wait for the norm] in
// engine/state_home_device.cc). The one copy of the partials to the host (KiBs) is not timed apart.
void EngineSim::norm_on_device() {
  auto bytes = static_cast<double>(norm_partials_total(p_));
  for (std::size_t g = 0; g < p_.groups.size(); ++g) bytes += static_cast<double>(final_grad_bytes(p_, g));
  host_wait(comm("gradient norm", device_pass(bytes), host_, bytes, SimQueue::Compute));
}

// The device home's step (on the comm stream, not waited for by the host): the update of every
// group's state, then at stages 1-2 the new full W all-gathered (WorkingWeights::publish). The sim
// device runs the update with the CPU kernels; a GPU is bound by its memory.
void EngineSim::end_step_on_device() {
  double elems = 0;
  for (const GroupPlan& P : p_.groups) elems += static_cast<double>(P.state_elems);
  const double bytes = elems * (2.0 * 4 * p_.state_arrays + 4 + wbytes());
  const double seconds = m_.device_is_host ? adam(elems) : device_pass(bytes);
  double end = comm("optimizer update", seconds, host_, bytes, SimQueue::Compute);
  if (p_.stage == 1 || p_.stage == 2) {
    for (std::size_t g = 0; g < p_.groups.size(); ++g) {
      if (plan(g).sharded_params) continue;
      const auto full_bytes = static_cast<double>(resident_weight_bytes(p_, g));
      end = collective("publish " + gname(g), plan(g).layout.shard_count(), full_bytes, 1, end);
    }
  }
  published_ = end;
}

}  // namespace detail

SimResult simulate_step(const StepWorkload& workload, const SimMachine& machine) {
  STRATA_CHECK(!workload.stage.split(), "simulate_step of pipeline stage {} of {}: simulate_pipelined_step runs stages",
               workload.stage.rank, workload.stage.stages);
  detail::check_machine(workload, machine);
  Timeline timeline = detail::machine_timeline(machine);
  detail::EngineSim engine(workload, machine, timeline);
  // A warm-up step brings the queues to the steady state; the second step is the answer.
  engine.start_prefetch();
  const double from = engine.run_step();
  const double to = engine.run_step();
  return detail::step_result(timeline, from, to, workload.tokens_per_step);
}

}  // namespace strata::sim
