#include "autodiff/thread_choice.hpp"

#include <algorithm>
#include <chrono>
#include <mutex>

namespace tapegrad::detail {

int ThreadChoice::choose(std::uint64_t key, int wanted, double now) {
  if (wanted <= 1) return 1;
  if (arms_.size() >= kMaxKinds && !arms_.contains(key)) arms_.clear();
  const auto [it, inserted] = arms_.try_emplace(key);
  Arms& a = it->second;
  if (inserted && holding(now)) a.current = 0;
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

void ThreadChoice::record(std::uint64_t key, int threads, double seconds, double now) {
  const auto it = arms_.find(key);
  if (it == arms_.end()) return;
  Arms& a = it->second;
  const int arm = threads > 1 ? 1 : 0;
  // The current arm keeps a running mean that forgets (one slow run, a page fault or the team's
  // first start, must not decide alone); a trial comes after a long gap, in which the machine's
  // load may have changed, so it replaces what was known of its arm.
  const bool trial_run = a.trial && arm != a.current;
  a.seconds[arm] = a.runs[arm] > 0 && !trial_run ? 0.7 * a.seconds[arm] + 0.3 * seconds : seconds;
  a.last[arm] = seconds;
  a.runs[arm] = std::min(a.runs[arm] + 1, 2);
  const int other = 1 - arm;
  if (arm == a.current) {
    // The current arm just ran slower than the other one's last known time: the machine's
    // load has changed, so try the other at the next call rather than after the interval.
    if (!a.trial && a.runs[other] > 0 && seconds > a.seconds[other]) a.countdown = std::min(a.countdown, 1);
    return;
  }
  if (!trial_run) return;
  a.trial = false;
  judge_team(a, now);
  if (a.runs[a.current] == 0 || a.seconds[arm] < kSwitchMargin * a.seconds[a.current]) {
    a.current = arm;
    a.interval = kFirstInterval;
  } else {
    a.interval = std::min(kIntervalGrowth * a.interval, kMaxInterval);
  }
  a.countdown = a.interval;
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

void record_threads(std::uint64_t key, int threads, double start) {
  const double now = now_seconds();
  std::lock_guard lock(g_mutex);
  g_choice.record(key, threads, now - start, now);
}

}  // namespace tapegrad::detail
