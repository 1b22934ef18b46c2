// The step simulator's pipelined step (sim/step_sim.h): P stage ranks, each its own engine and
// queues, driven through the stage's schedule with the point-to-point messages between them.
//
// Note [Pipelined step simulation]: each stage's rank is the engine model of Note [Step simulator] in sim/step_sim.h
// (sim/step_sim_engine.h) over its own queues (a GPU each), running what PipelineRunner::run_step
// (models/pipeline_runner.cc) issues, in its order: at the step's start the tied embedding's send
// (first stage: its embedding group acquired, the weights sent alone, the compute stream waiting
// for the send, the group released; last stage: the receive); then per op of the stage's schedule
// (models::pipeline_schedule, GPipe or 1F1B)
//   forward a:  an exchange of the held sends and the activations from the previous stage; take an
//               output buffer (a ring of two: the compute stream waits for the send of forward
//               a - 2); the stage_forward's actions; hold the output's send to the next stage;
//   backward a: take a gradient buffer (the send of backward a - 2 to the previous stage); an
//               exchange of the held sends and the gradient from the next stage (with a tied
//               embedding, on the first stage also the last stage's final-norm output; the last
//               stage takes its buffer for it); the stage_backward's actions (re-materialized: the
//               forward again first; the last stage: the head and loss); hold the input gradient's
//               send (and the final-norm output's to the first stage); the next op's exchange (its
//               buffer taken first) goes out now, not at that op; the host waits for the compute
//               stream;
// then an exchange of the last held sends, and the host waits for them. An exchange (Note [Grouped
// transfers]) starts when the compute stream reaches it and the stage's previous exchange has ended
// (Note [Issue order] in comm/communicator.h); with receives it is on the compute stream, which waits for all of its
// transfers, and without them on the send stream, which nothing waits for but the buffer rings and
// the step's end. A transfer starts once both ends' exchanges have started and moves bytes /
// gpus.link_gbps over the sender's link (its collectives queue). Receives charge the receiver
// nothing but the wait. The step ends with the trainer's
// collectives over the stages: the span's all-reduce after the micro-batches, the gradient norm's in
// step() (after each stage's reductions and sums), the loss's after it; so every stage's step is as
// long as the slowest's, and the prediction is that. Two steps are simulated (the first warms the
// queues up), as for one rank.
//
// Each stage's figures are its own: its queues' busy time, and as Note [Measured bubble] in models/pipeline_runner.h
// measures them its forwards' and backwards' busy time (from the moment its input has arrived and its stream
// reached the op, to the op's last model op) against the pipeline's span (from the step's start to
// the last such op on any stage): 1 - busy / span is its bubble, which for equal stages and free
// messages is (P - 1) / (A + P - 1) under either schedule.
//
// Left out: latency of a message (no machine file has one), the receiver's incoming link (full
// duplex: only the sender's outgoing one queues), the host's own time between ops (as for one rank),
// and the first step's stash allocation; "auto" placement is the first stage's (what estimate
// resolves) on every stage. Every stage's rank shares the node's host figures with the others
// (rates_of over D x T x P ranks).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "train/output_file.h"
#include "sim/step_sim.h"
#include "sim/step_sim_engine.h"

namespace strata::sim {
namespace {

using detail::EngineSim;

constexpr double kUnknown = std::numeric_limits<double>::quiet_NaN();
bool known(double t) { return !std::isnan(t); }

// One point-to-point message. `issued`: when the sender's exchange holding it started; `done`: when
// the receive, and with it the send, completed.
struct Message {
  double issued = kUnknown;
  double done = kUnknown;
};

// The messages of one kind from one stage to another, by micro-batch (one for the tied weights).
struct Channel {
  int from = 0, to = 0;
  std::string what;
  double bytes = 0;
  std::vector<Message> messages;
};

// A message of a channel: the channel and the micro-batch.
struct MessageRef {
  Channel* channel = nullptr;
  int micro = 0;
  Message& message() const { return channel->messages[static_cast<std::size_t>(micro)]; }
};

// One thing a stage's host issues, in order (Note [Pipelined step simulation]). An exchange is
// Begin (its held sends), a Recv per receive, End.
struct StageStep {
  enum Kind : std::uint8_t { Run, Begin, Recv, End, WaitSent, Sync, SendsDone };
  enum Op : std::uint8_t { None, Forward, Backward };
  Kind kind = Run;
  Op op = None;
  int micro = 0;
  Channel* channel = nullptr;
  std::span<const SimAction> actions;
  std::vector<MessageRef> sends;  // Begin, End: the exchange's sends
  bool alone = false;             // Begin, End: no receives (on the send stream)
};

SimLane send_lane(int from, int to) {
  if (to == from + 1) return SimLane::SendNext;
  if (to == from - 1) return SimLane::SendPrev;
  return SimLane::SendFar;
}

bool has_compute(std::span<const SimAction> actions) {
  for (const SimAction& a : actions) {
    if (a.kind == SimAction::Compute || a.kind == SimAction::TensorCollective) return true;
  }
  return false;
}

class PipelineSim {
 public:
  PipelineSim(std::span<const StepWorkload> stages, const SimMachine& machine)
      : w_(stages), link_(machine.spec.gpus.link_gbps * detail::kGiga) {
    const auto P = static_cast<int>(stages.size());
    for (int p = 0; p < P; ++p) {
      const StepWorkload& w = stages[static_cast<std::size_t>(p)];
      STRATA_CHECK(w.stage.stages == P && w.stage.rank == p, "stage workload {} of {} is stage {} of {}", p, P,
                   w.stage.rank, w.stage.stages);
      detail::check_machine(w, machine);
      timelines_.push_back(std::make_unique<Timeline>(detail::machine_timeline(machine)));
    }
    for (std::size_t p = 0; p < stages.size(); ++p) {
      engines_.push_back(std::make_unique<EngineSim>(w_[p], machine, *timelines_[p]));
    }
    stats_.resize(stages.size());
  }

  PipelineSimResult run() {
    for (auto& e : engines_) e->start_prefetch();
    const double from = run_step();
    for (StageStats& s : stats_) s = StageStats{};
    const double to = run_step();
    PipelineSimResult r;
    const StepWorkload& first = w_.front();
    r.step_seconds = to - from;
    r.tokens_per_second = r.step_seconds > 0 ? static_cast<double>(first.tokens_per_step) / r.step_seconds : 0;
    r.ideal_bubble_fraction = models::pipeline_bubble_fraction(first.stage.stages, first.micro_batches);
    double last_op = from;
    for (const StageStats& s : stats_) last_op = std::max(last_op, s.last_op_end);
    r.span_seconds = last_op - from;
    for (std::size_t p = 0; p < w_.size(); ++p) {
      StageSimResult s;
      s.sim = detail::step_result(*timelines_[p], from, to, first.tokens_per_step);
      s.busy_seconds = stats_[p].busy;
      s.bubble_fraction = r.span_seconds > 0 ? 1 - s.busy_seconds / r.span_seconds : 0;
      s.peak_in_flight = peak_in_flight(stats_[p]);
      s.sent_bytes = stats_[p].sent;
      s.received_bytes = stats_[p].received;
      if (p > 0 && s.busy_seconds > r.stages[r.busiest_stage].busy_seconds) r.busiest_stage = p;
      r.stages.push_back(std::move(s));
    }
    return r;
  }

 private:
  // One stage's figures over a step.
  struct StageStats {
    double busy = 0;
    double last_op_end = 0;
    std::vector<double> forward_start, backward_end;  // per micro-batch
    std::uint64_t sent = 0, received = 0;
  };

  int stages() const { return static_cast<int>(w_.size()); }
  const StageWork& stage(int p) const { return w_[static_cast<std::size_t>(p)].stage; }
  EngineSim& engine(int p) { return *engines_[static_cast<std::size_t>(p)]; }

  // Every stage's host at the latest one's time: a collective over the stages on the host.
  double barrier() {
    double t = 0;
    for (auto& e : engines_) t = std::max(t, e->host());
    for (auto& e : engines_) e->host_waits_for(t);
    return t;
  }

  Channel* channel(int from, int to, std::string what, double bytes, int messages) {
    auto c = std::make_unique<Channel>();
    c->from = from;
    c->to = to;
    c->what = std::move(what);
    c->bytes = bytes;
    c->messages.assign(static_cast<std::size_t>(messages), Message{});
    channels_.push_back(std::move(c));
    return channels_.back().get();
  }

  // Stage p's host program for one step (PipelineRunner::run_step).
  std::vector<StageStep> program(int p, const std::vector<Channel*>& next, const std::vector<Channel*>& back,
                                 Channel* tied, Channel* norm) const {
    const StepWorkload& w = w_[static_cast<std::size_t>(p)];
    const StageWork& S = w.stage;
    std::vector<StageStep> out;
    const auto add = [&](StageStep::Kind kind, Channel* c, int micro) {
      out.push_back(StageStep{kind, StageStep::None, micro, c, {}, {}, false});
    };
    // See Note [Grouped transfers] in models/pipeline_runner.h.
    // The held sends and `receives` as one exchange.
    std::vector<MessageRef> held;
    const auto exchange = [&](const std::vector<MessageRef>& receives) {
      if (held.empty() && receives.empty()) return;
      const bool alone = receives.empty();
      out.push_back(StageStep{StageStep::Begin, StageStep::None, 0, nullptr, {}, held, alone});
      for (const MessageRef& r : receives) add(StageStep::Recv, r.channel, r.micro);
      out.push_back(StageStep{StageStep::End, StageStep::None, 0, nullptr, {}, held, alone});
      held.clear();
    };
    if (S.tied() && S.first()) {  // share_tied_embedding: the send alone, then the compute stream waits for it
      out.push_back(StageStep{StageStep::Run, StageStep::None, 0, nullptr, std::span(S.share_tied).first(1), {}, false});
      held.push_back({tied, 0});
      exchange({});
      add(StageStep::WaitSent, tied, 0);
      out.push_back(StageStep{StageStep::Run, StageStep::None, 0, nullptr, std::span(S.share_tied).subspan(1), {}, false});
    }
    if (S.tied() && S.last()) exchange({{tied, 0}});
    const auto P = static_cast<std::size_t>(p);
    // An op's exchange (PipelineRunner::post): a backward first takes its gradient buffer (the ring
    // of two: the send of backward a - 2 to the previous stage).
    const auto post = [&](const models::PipelineOp& op) {
      const int a = op.micro;
      std::vector<MessageRef> receives;
      if (op.forward) {
        if (!S.first()) receives.push_back({next[P - 1], a});
      } else {
        if (!S.first() && a >= 2) add(StageStep::WaitSent, back[P], a - 2);
        if (!S.last()) receives.push_back({back[P + 1], a});
        if (S.tied() && S.first()) receives.push_back({norm, a});
      }
      exchange(receives);
    };
    std::vector<bool> posted(S.ops.size(), false);
    for (std::size_t i = 0; i < S.ops.size(); ++i) {
      const models::PipelineOp& op = S.ops[i];
      const int a = op.micro;
      if (!posted[i]) post(op);
      if (op.forward) {
        if (!S.last() && a >= 2) add(StageStep::WaitSent, next[P], a - 2);  // the output ring of two
        out.push_back(StageStep{StageStep::Run, StageStep::Forward, a, nullptr, S.forward(w), {}, false});
        if (!S.last()) held.push_back({next[P], a});
        continue;
      }
      if (S.tied() && S.last() && a >= 2) add(StageStep::WaitSent, norm, a - 2);
      out.push_back(StageStep{StageStep::Run, StageStep::Backward, a, nullptr, S.backward(w), {}, false});
      if (!S.first()) held.push_back({back[P], a});
      if (S.tied() && S.last()) held.push_back({norm, a});
      if (i + 1 < S.ops.size()) {  // the next op's exchange before the host's wait
        post(S.ops[i + 1]);
        posted[i + 1] = true;
      }
      add(StageStep::Sync, nullptr, a);
    }
    exchange({});
    add(StageStep::SendsDone, nullptr, 0);
    return out;
  }

  // Runs stage p's step `s` if what it waits for is known; false if it must wait for another stage.
  bool try_run(int p, const StageStep& s) {
    EngineSim& e = engine(p);
    const auto i = static_cast<std::size_t>(p);
    StageStats& st = stats_[i];
    switch (s.kind) {
      case StageStep::Run: {
        const double start = e.compute_stream_at();  // see Note [Measured bubble] in models/pipeline_runner.h: the op's start event
        e.run_actions(s.actions, s.micro);
        const auto a = static_cast<std::size_t>(s.micro);
        if (s.op == StageStep::Forward) st.forward_start[a] = start;
        if (s.op != StageStep::None && has_compute(s.actions)) {
          st.busy += e.compute_end() - start;
          st.last_op_end = std::max(st.last_op_end, e.compute_end());
        }
        if (s.op == StageStep::Backward) st.backward_end[a] = e.compute_end();
        return true;
      }
      case StageStep::Begin: {  // after the compute stream's work so far and the previous exchange
        const double start = std::max(e.compute_stream_at(), exchange_done_[i]);
        exchange_start_[i] = exchange_done_[i] = start;
        for (const MessageRef& r : s.sends) {
          r.message().issued = start;
          sends_[i].push_back(&r.message());
          st.sent += static_cast<std::uint64_t>(r.channel->bytes);
        }
        return true;
      }
      case StageStep::Recv: {  // once both ends' exchanges have started, over the sender's link
        Message& m = s.channel->messages[static_cast<std::size_t>(s.micro)];
        if (!known(m.issued)) return false;
        const double start = std::max(m.issued, exchange_start_[i]);
        Timeline& sender = *timelines_[static_cast<std::size_t>(s.channel->from)];
        m.done = sender.add(fmt::format("send {} {} to stage {}", s.channel->what, s.micro, s.channel->to),
                            send_lane(s.channel->from, s.channel->to), SimQueue::Collective,
                            transfer_seconds(s.channel->bytes, link_), start,
                            static_cast<std::uint64_t>(s.channel->bytes));
        exchange_done_[i] = std::max(exchange_done_[i], m.done);
        st.received += static_cast<std::uint64_t>(s.channel->bytes);
        return true;
      }
      case StageStep::End: {  // when every transfer has; the compute stream waits unless it ran alone
        for (const MessageRef& r : s.sends) {
          if (!known(r.message().done)) return false;
        }
        for (const MessageRef& r : s.sends) exchange_done_[i] = std::max(exchange_done_[i], r.message().done);
        if (!s.alone) e.compute_waits_for(exchange_done_[i]);
        return true;
      }
      case StageStep::WaitSent: {
        const Message& m = s.channel->messages[static_cast<std::size_t>(s.micro)];
        if (!known(m.done)) return false;
        e.compute_waits_for(m.done);
        return true;
      }
      case StageStep::Sync: e.synchronize_compute(); return true;
      case StageStep::SendsDone: {
        for (const Message* m : sends_[i]) {
          if (!known(m->done)) return false;
        }
        for (const Message* m : sends_[i]) e.host_waits_for(m->done);
        return true;
      }
    }
    return false;
  }

  // One step from the stages' common start; returns its end (every stage's host then).
  double run_step() {
    const int P = stages();
    const StageWork& S0 = stage(0);
    const int A = w_.front().micro_batches;
    channels_.clear();
    sends_.assign(static_cast<std::size_t>(P), {});
    exchange_start_.assign(static_cast<std::size_t>(P), 0);
    exchange_done_.assign(static_cast<std::size_t>(P), 0);
    // next[p]: stage p's outputs to p + 1; back[p]: the gradients of its inputs to p - 1.
    std::vector<Channel*> next(static_cast<std::size_t>(P), nullptr), back(static_cast<std::size_t>(P), nullptr);
    for (int p = 0; p + 1 < P; ++p) {
      next[static_cast<std::size_t>(p)] = channel(p, p + 1, "activations", S0.boundary_bytes, A);
    }
    for (int p = 1; p < P; ++p) back[static_cast<std::size_t>(p)] = channel(p, p - 1, "gradient", S0.boundary_bytes, A);
    Channel* tied = S0.tied() ? channel(0, P - 1, "tied embedding", S0.tied_bytes, 1) : nullptr;
    Channel* norm = S0.tied() ? channel(P - 1, 0, "final norm output", S0.head_bytes, A) : nullptr;
    std::vector<std::vector<StageStep>> programs;
    for (int p = 0; p < P; ++p) {
      programs.push_back(program(p, next, back, tied, norm));
      StageStats& st = stats_[static_cast<std::size_t>(p)];
      st.forward_start.assign(static_cast<std::size_t>(A), 0);
      st.backward_end.assign(static_cast<std::size_t>(A), 0);
    }
    // Each stage runs as far as it can; one that waits on another's message yields. The engine's
    // schedule is free of deadlock, so every round moves some stage on.
    std::vector<std::size_t> at(static_cast<std::size_t>(P), 0);
    for (bool done = false; !done;) {
      bool moved = false;
      done = true;
      for (int p = 0; p < P; ++p) {
        const auto i = static_cast<std::size_t>(p);
        while (at[i] < programs[i].size() && try_run(p, programs[i][at[i]])) {
          ++at[i];
          moved = true;
        }
        done = done && at[i] == programs[i].size();
      }
      STRATA_CHECK(done || moved, "the simulated pipeline of {} stages waits on itself", P);
    }
    barrier();  // the span's all-reduce over the stages (PipelineRunner::run_step)
    for (auto& e : engines_) e->wait_for_gradients();
    barrier();  // the gradient norm's sum over the stages (ZeroEngine::global_sum_squares)
    for (auto& e : engines_) e->update();
    return barrier();  // the loss's all-reduce
  }

  // The most micro-batches whose forward had begun and backward had not ended, at a forward's start.
  static int peak_in_flight(const StageStats& s) {
    int peak = 0;
    for (double t : s.forward_start) {
      int live = 0;
      for (std::size_t a = 0; a < s.forward_start.size(); ++a) live += s.forward_start[a] <= t && t < s.backward_end[a];
      peak = std::max(peak, live);
    }
    return peak;
  }

  std::span<const StepWorkload> w_;
  double link_;
  std::vector<std::unique_ptr<Timeline>> timelines_;
  std::vector<std::unique_ptr<EngineSim>> engines_;
  std::vector<StageStats> stats_;
  std::vector<std::unique_ptr<Channel>> channels_;
  std::vector<std::vector<const Message*>> sends_;  // per stage: its messages this step
  // Per stage: its latest exchange's start and end so far (see Note [Issue order] in comm/communicator.h: the next starts after it).
  std::vector<double> exchange_start_, exchange_done_;
};

}  // namespace

PipelineSimResult simulate_pipelined_step(std::span<const StepWorkload> stages, const SimMachine& machine) {
  STRATA_CHECK(stages.size() >= 2, "a pipelined step of {} stage(s)", stages.size());
  return PipelineSim(stages, machine).run();
}

void write_stage_trace(const PipelineSimResult& result, const std::string& path) {
  const auto P = static_cast<int>(result.stages.size());
  nlohmann::json events = nlohmann::json::array();
  for (int p = 0; p < P; ++p) {
    const auto peer = [&](SimLane lane) {
      return lane == SimLane::SendNext ? p + 1 : lane == SimLane::SendPrev ? p - 1 : p == 0 ? P - 1 : 0;
    };
    std::vector<SimLane> lanes;  // tid: the lane's place in this list
    const auto tid = [&](SimLane lane) {
      auto it = std::find(lanes.begin(), lanes.end(), lane);
      if (it == lanes.end()) it = lanes.insert(lanes.end(), lane);
      return static_cast<int>(it - lanes.begin());
    };
    for (const SimOp& op : result.stages[static_cast<std::size_t>(p)].sim.ops) {
      events.push_back({{"name", op.name}, {"cat", sim_queue_name(op.queue)}, {"ph", "X"}, {"pid", p},
                        {"tid", tid(op.lane)}, {"ts", op.begin * 1e6}, {"dur", (op.end - op.begin) * 1e6},
                        {"args", {{"bytes", op.bytes}}}});
    }
    events.push_back(
        {{"name", "process_name"}, {"ph", "M"}, {"pid", p}, {"args", {{"name", fmt::format("pipeline stage {}", p)}}}});
    for (std::size_t t = 0; t < lanes.size(); ++t) {
      const SimLane lane = lanes[t];
      const bool send = lane == SimLane::SendNext || lane == SimLane::SendPrev || lane == SimLane::SendFar;
      // A transfer occupies the sender's link to its peer (the engine's exchanges run on its compute
      // or send stream: Note [Grouped transfers] in models/pipeline_runner.h).
      const std::string name = send ? fmt::format("link to stage {}", peer(lane)) : sim_lane_name(lane);
      events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", p}, {"tid", t}, {"args", {{"name", name}}}});
    }
  }
  train::OutputFile out(path, "--trace", train::OutputFile::Mode::Truncate);
  out.write(nlohmann::json{{"traceEvents", events}}.dump() + "\n");
  out.close();
}

}  // namespace strata::sim
