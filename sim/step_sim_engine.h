// The step simulator's model of one rank's engine (Note [Step simulator], sim/step_sim.h): the
// parameter fetcher, the gradient reducer and the state homes, replaying on a Timeline what the
// engine enqueues. Internal to the simulator: simulate_step (sim/step_sim.cc) runs it for one
// rank, simulate_pipelined_step (sim/step_sim_stages.cc) for each pipeline stage.
#pragma once

#include <algorithm>
#include <deque>
#include <span>
#include <string>
#include <vector>

#include "engine/offload_tier.h"
#include "sim/step_sim.h"
#include "sim/step_sim_timeline.h"

namespace strata::sim::detail {

inline constexpr double kGiga = 1e9;

// The machine's figures in bytes/s, FLOP/s and params/s.
struct Rates {
  double flops = 0;
  double block_eff = 0, head_eff = 0;
  double link = 0;
  double device_memory = 0;  // bytes read + written per second
  double host_memory = 0;    // same
  double adam = 0;           // parameters per second
  PipelineRates io;
};

// The simulated rank's rates. What the node's `ranks` share (the drives, host memory, the CPU's
// Adam rate) is split evenly among them: every rank runs the same step at the same time. The drives
// are a DriveModel of `plan`'s engine (Note [Drive curves] in plan/machine_curve.h).
Rates rates_of(const SimMachine& m, int ranks, const RunPlan& plan);
// The figures the workload needs must be there: one ConfigError naming the field.
void check_machine(const StepWorkload& w, const SimMachine& m);
// A timeline with the machine's queues (on the sim device model ops and CPU work share one).
Timeline machine_timeline(const SimMachine& m);
// The step [from, to) of `timeline`: its queues' busy time, the slowest, its NVMe bytes and its
// operations with times from `from`.
SimResult step_result(const Timeline& timeline, double from, double to, std::int64_t tokens_per_step);

class EngineSim {
 public:
  EngineSim(const StepWorkload& w, const SimMachine& m, Timeline& timeline)
      : w_(w), p_(w.plan), m_(m), r_(rates_of(m, w.plan.topo.world_size * w.tensor_ranks * w.stage.stages, w.plan)), tl_(timeline),
        groups_(w.plan.groups.size()) {
    build_trace();
  }

  // What the previous step's end (ParamFetcher::end_step) started: the step's first gathers.
  void start_prefetch() { prefetch_after(0); }

  // One step from the host's current time; returns the host's time when step() returned.
  double run_step();

  // The pieces of a step, for a pipeline stage's step (sim/step_sim_stages.cc), which issues
  // them in its schedule's order between its sends and receives. run_step is these in a row.
  // The actions of one micro-batch (`unit`: its index in the step), issued by the host now.
  void run_actions(std::span<const SimAction> actions, int unit);
  // The host waits for the compute stream (the end of a micro-batch).
  void synchronize_compute() { host_wait(last_compute_); }
  // step(), first its host sync on every reduction and gradient sum, then the update.
  void wait_for_gradients();
  void update();
  double host() const { return host_; }
  void host_waits_for(double t) { host_wait(t); }
  // When an operation enqueued now on the compute stream would start: what a receive posted there
  // waits for, and when an event recorded there completes.
  double compute_stream_at() const {
    return std::max({host_, compute_wait_, tl_.lane_end(SimLane::Compute)});
  }
  // The compute stream waits for an event (a receive's completion, a send that frees a buffer).
  void compute_waits_for(double t) { compute_wait_ = std::max(compute_wait_, t); }
  // The end of the latest model op: the event a send after it waits for.
  double compute_end() const { return last_compute_; }

 private:
  struct Group {
    bool gathered = false;
    double gathered_at = 0;
    int live = 0;
  };

  // The trainer's thread blocks until `t`; woken then (Note [Wake-ups] in sim/step_sim.h) when it had to wait.
  void host_wait(double t) {
    if (t > host_) host_ = t + tl_.wake_seconds();
  }
  const GroupPlan& plan(std::size_t g) const { return p_.groups[g]; }
  double wbytes() const { return static_cast<double>(p_.working_bytes()); }
  std::string gname(std::size_t g) const { return w_.group_names[g]; }
  // W of group g lives on the parameter tier (else on the device, updated by a copy up).
  bool weights_on_tier(std::size_t g) const { return p_.params_offloaded() && plan(g).sharded_params; }

  double device_pass(double bytes) const { return transfer_seconds(bytes, r_.device_memory); }
  double host_pass(double bytes) const { return transfer_seconds(bytes, r_.host_memory); }
  double adam(double elems) const { return transfer_seconds(elems, r_.adam); }
  // Ring algorithms over `ranks` GPUs: all-gather and reduce-scatter move (n-1)/n of the full
  // buffer through each GPU's link, all-reduce twice that. One rank: a copy inside the device.
  double collective(const std::string& name, int ranks, double full_bytes, double passes, double ready) {
    if (ranks <= 1) return comm(name, device_pass(2 * full_bytes), ready, full_bytes, SimQueue::Compute);
    const double seconds = passes * (ranks - 1) / ranks * transfer_seconds(full_bytes, r_.link);
    return comm(name, seconds, ready, full_bytes, SimQueue::Collective);
  }
  // An operation on the comm stream, issued by the host now.
  double comm(const std::string& name, double seconds, double ready, double bytes, SimQueue queue) {
    return tl_.add(name, SimLane::Comm, queue, seconds, std::max(ready, host_), static_cast<std::uint64_t>(bytes));
  }

  void build_trace();
  void dispatch(const SimAction& act, int unit);
  void acquire(std::size_t g);
  void release(std::size_t g);
  void start_gather(std::size_t g);
  void prefetch_after(std::size_t position);
  void reduce(std::size_t g, int unit);
  // Returns when the unit's work on the comm stream ends (the reduction's buffers are freed then).
  double add_unit(std::size_t g, int unit, double reduced_at);
  std::vector<PipelineJob> combine_jobs(std::size_t g, int unit) const;
  std::vector<PipelineJob> update_jobs() const;
  void add_nvme(PipelineJob& job, std::span<const ChunkField> fields) const;
  void norm_on_device();
  void end_step_on_device();

  const StepWorkload& w_;
  const RunPlan& p_;
  const SimMachine& m_;
  Rates r_;
  Timeline& tl_;
  std::vector<Group> groups_;
  std::vector<std::size_t> trace_;  // every acquisition of a step, in order
  std::size_t pos_ = 0;
  std::uint64_t live_elems_ = 0;
  std::vector<double> param_slot_back_;  // when each reservation's pinned parameter slot came back
  double host_ = 0;          // the trainer's thread
  double compute_wait_ = 0;  // events the compute stream waits on
  double last_compute_ = 0;  // end of the latest model op
  double published_ = 0;     // the last publish of stage 1-2 working weights
  // Note [Reductions in flight] (engine/grad_reducer.cc): when the queued reductions end, oldest first.
  std::deque<double> in_flight_;
};

}  // namespace strata::sim::detail
