#include "runtime/thread_choice.hpp"

#include "runtime/parallel.hpp"

#include <algorithm>
#include <chrono>
#include <mutex>

namespace tapegrad::detail {

int ThreadChoice::choose(std::uint64_t key, int wanted, double now) {
  if (wanted <= 1) return 1;
  if (arms_.size() >= kMaxKinds && !arms_.contains(key)) arms_.clear();
  Arms& a = arms_[key];
  if (a.team != wanted) {
    // A new kind, or a new thread count: the kind's times were for another team, and a
    // verdict against two threads says nothing about four.
    a = Arms{};
    a.team = wanted;
    if (holding(now)) a.current = 0;
  }
  int arm = a.current;
  if (--a.countdown <= 0) {
    const int other = 1 - a.current;
    if (other == 1 && holding(now)) {
      a.countdown = 1;  // asks again at the next call
    } else {
      a.trial = true;
      arm = other;
      // Past a hold, this trial decides for every kind: the others wait for its result.
      if (other == 1 && hold_ > 0) hold_until_ = now + hold_;
    }
  }
  return arm == 1 ? wanted : 1;
}

void ThreadChoice::judge_team(const Arms& a, double now) noexcept {
  // A team's first run also starts its threads (and a product's first run touches fresh
  // memory): it alone does not say the machine is busy.
  if (a.runs[0] < 1 || a.runs[1] < 2) return;
  // Work this short proves nothing about the machine: waking a sleeping worker alone makes its
  // team run slower than one thread.
  if (a.last[0] < kJudgeFrom) return;
  // The latest runs, not the running means: a load that has just come must start the hold now.
  // Two such verdicts in a row (of any kinds) start a hold: one slow run of the team can be a
  // moment's noise on an idle machine, and a hold there would cost every kind its speed-up.
  if (a.last[1] > kBusyRatio * a.last[0]) {
    if (++busy_verdicts_ < 2) return;
    hold_ = hold_ > 0 ? std::min(2 * hold_, kMaxHold) : kFirstHold;
    hold_until_ = now + hold_;
  } else if (a.last[1] < a.last[0]) {
    busy_verdicts_ = 0;
    hold_ = 0;
  }
}

void ThreadChoice::record(std::uint64_t key, int threads, double seconds, double now, double one_thread_estimate) {
  const auto it = arms_.find(key);
  if (it == arms_.end()) return;
  Arms& a = it->second;
  // A team's run that started before the kind was reset for another team size (another
  // thread called set_num_threads meanwhile) says nothing of the new team.
  if (threads > 1 && threads != a.team) return;
  const int arm = threads > 1 ? 1 : 0;
  const bool trial_run = a.trial && arm != a.current;
  note(a, arm, seconds, trial_run);
  if (arm == 1 && one_thread_estimate > 0) {
    // The team's chunks timed one by one: both choices measured in one run, no trial needed.
    note(a, 0, one_thread_estimate, false);
    if (trial_run) a.trial = false;
    judge_team(a, now);
    decide(a, a.seconds[0] < kSwitchMargin * a.seconds[1] ? 0 : 1);
    return;
  }
  const int other = 1 - arm;
  if (arm == a.current) {
    // The current arm just ran slower than the other one's last known time, or the team much
    // slower than its best: the machine's load has changed, so try the other at the next call.
    const bool behind = a.runs[other] > 0 && seconds > a.seconds[other];
    const bool slowed = arm == 1 && a.runs[1] >= 2 && seconds > kBusyRatio * a.best_team;
    if (!a.trial && (behind || slowed)) a.countdown = std::min(a.countdown, 1);
    return;
  }
  if (!trial_run) return;
  a.trial = false;
  judge_team(a, now);
  decide(a, a.runs[a.current] == 0 || a.seconds[arm] < kSwitchMargin * a.seconds[a.current] ? arm : a.current);
  // One thread tried and the team kept: the team's present pace is its pace now. Measured
  // against a best run from calmer moments, every later run of it would look "slowed" and ask
  // for a trial again, and each trial moves the work's data to one core and back.
  if (arm == 0 && a.current == 1) a.best_team = a.seconds[1];
}

void ThreadChoice::note(Arms& a, int arm, double seconds, bool trial_run) noexcept {
  // The current arm keeps a running mean that forgets (one slow run, a page fault or the team's
  // first start, must not decide alone); a trial comes after a long gap, in which the machine's
  // load may have changed, so it replaces what was known of its arm.
  a.seconds[arm] = a.runs[arm] > 0 && !trial_run ? 0.7 * a.seconds[arm] + 0.3 * seconds : seconds;
  a.last[arm] = seconds;
  if (arm == 1) a.best_team = a.runs[1] > 0 ? std::min(a.best_team, seconds) : seconds;
  a.runs[arm] = std::min(a.runs[arm] + 1, 2);
}

void ThreadChoice::decide(Arms& a, int arm) noexcept {
  if (arm != a.current) {
    a.current = arm;
    a.interval = kFirstInterval;
  } else {
    a.interval = std::min(kIntervalGrowth * a.interval, kMaxInterval);
  }
  // On the team, one thread is tried only when the team shows it has slowed: a trial on one
  // thread costs (team size - 1) runs of the team, a lot on a machine of many cores.
  a.countdown = a.current == 1 ? kNoTrial : a.interval;
}

namespace {

std::mutex g_mutex;
ThreadChoice g_choice;

}  // namespace

double now_seconds() noexcept {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

int choose_threads(std::uint64_t key, int wanted, double start) {
  if (wanted <= 1) return 1;
  std::lock_guard lock(g_mutex);
  return g_choice.choose(key, wanted, start);
}

void record_threads(std::uint64_t key, int threads, double start, double one_thread_estimate) {
  const double now = now_seconds();
  std::lock_guard lock(g_mutex);
  g_choice.record(key, threads, now - start, now, one_thread_estimate);
}

}  // namespace tapegrad::detail
