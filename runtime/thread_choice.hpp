// Internal: whether parallel work runs on the team or on the calling thread, decided from what
// each kind of work actually took lately rather than from its size alone.
//
// The size rules (parallel_for's grain, a product's 2^20 multiply-adds per thread) say when a
// second thread pays on an idle machine. When another process holds a core, the same split can
// cost more than the serial run: a task that a worker has taken waits for the scheduler to give
// that worker its core back, and the workers' spinning takes time from the other process
// (docs/threads.md). So tapegrad measures: each kind of work (a product's layout, a loop's call site and size class) keeps a running
// time for one thread and for the team and runs the faster one.
// - A loop's team run also times its chunks one by one; their sum is what one thread would
//   have taken, so every team run weighs both choices.
// - A product on the team is tried on one thread once, at its second call, and afterwards only
//   when the team shows it has slowed (slower than one thread was, or kBusyRatio times its own
//   best run, or than its pace when the last trial confirmed it): on a machine of many cores a
//   trial on one thread costs many runs of the team.
// - Work that runs on one thread tries the team after 2, 8, 32, 128, 512, then every 1024 calls,
//   and at once when one thread runs slower than the team last did.
//
// A busy machine is busy for every kind of work at once, and a trial of the team then costs a
// scheduler slice (milliseconds) whatever the work. So when two verdicts in a row find the team
// kBusyRatio times slower than one thread, a hold starts: new kinds of work start on one
// thread, and trials of the team wait until the hold ends, when one trial (of whichever kind
// comes first) decides for all. The hold doubles from kFirstHold to kMaxHold while the team
// keeps losing and ends when it wins.
#pragma once

#include <cstdint>
#include <unordered_map>

namespace tapegrad::detail {

// The policy, apart from clocks and locks so that tests can drive it with chosen times.
class ThreadChoice {
 public:
  // Calls between trials of the team for work that runs on one thread: the first after
  // kFirstInterval, then growing kIntervalGrowth-fold while one thread keeps winning, up to
  // kMaxInterval (each trial costs a slow run when the machine is busy). The first trial of one
  // thread, for work that starts on the team, also comes at the second call: until one
  // thread's time is known, a team that the machine cannot give is not noticed.
  static constexpr int kFirstInterval = 2;
  static constexpr int kIntervalGrowth = 4;
  static constexpr int kMaxInterval = 1024;
  // The other arm takes over when it is this much faster: measurements on a shared machine
  // wobble by a few percent, and a switch costs a trial to undo.
  static constexpr double kSwitchMargin = 0.95;

  // The team, this many times slower than one thread, says the machine cannot give it; a
  // team merely too small for its work (waking it costs a few microseconds) stays below.
  static constexpr double kBusyRatio = 1.5;
  // Seconds: only work that takes one thread at least this long can start a hold. Waking a
  // worker that has gone to sleep costs a good part of a shorter run, so its team looks slow on
  // an idle machine too, and such verdicts held every kind on one thread.
  static constexpr double kJudgeFrom = 1e-3;
  // Seconds. A trial of the team on a busy machine costs more than its run (the woken worker
  // spins on the core the caller needs); longer holds cost only speed-up when the machine has
  // become idle again.
  static constexpr double kFirstHold = 0.05;
  static constexpr double kMaxHold = 2.0;

  // The thread count for the next run of work `key`, which the size rule would give `wanted`
  // threads (> 1): `wanted` or 1. `now` is a monotonic time in seconds. A kind seen before with
  // another `wanted` (set_num_threads changed this kind's team) starts afresh.
  int choose(std::uint64_t key, int wanted, double now);
  // What that run took, in seconds, with `threads` threads; `now` when it ended. A team's run
  // may also say what one thread would have taken (its chunks' times summed).
  void record(std::uint64_t key, int threads, double seconds, double now, double one_thread_estimate = 0);
  // Whether trials of the team are held back (the team lost by kBusyRatio lately).
  bool holding(double now) const noexcept { return hold_ > 0 && now < hold_until_; }
  // Kinds of work seen; the table is cleared when it reaches kMaxKinds.
  std::size_t kinds() const noexcept { return arms_.size(); }
  static constexpr std::size_t kMaxKinds = 4096;

 private:
  struct Arms {
    double seconds[2] = {0.0, 0.0};  // running times: [0] one thread, [1] the team
    double last[2] = {0.0, 0.0};     // the latest run of each
    int runs[2] = {0, 0};            // runs recorded, counted up to 2 (all the rules ask)
    double best_team = 0.0;          // the team's fastest run, or its pace when a trial confirmed it
    int current = 1;  // the size rule's choice first
    int interval = kFirstInterval;
    int countdown = kFirstInterval;
    bool trial = false;  // the next record is a trial of the other arm
    int team = 0;        // the team size these times are for (`wanted`); 0: none yet
  };
  void judge_team(const Arms& a, double now) noexcept;
  static void note(Arms& a, int arm, double seconds, bool trial_run) noexcept;
  static void decide(Arms& a, int arm) noexcept;
  static constexpr int kNoTrial = 1 << 30;

  std::unordered_map<std::uint64_t, Arms> arms_;
  double hold_ = 0.0;  // 0: the team is not known to be slow
  double hold_until_ = 0.0;
  int busy_verdicts_ = 0;  // trials in a row that found the team kBusyRatio slower
};

}  // namespace tapegrad::detail
