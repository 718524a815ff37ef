#include "autodiff/thread_choice.hpp"

#include <algorithm>
#include <chrono>
#include <mutex>

namespace tapegrad::detail {

int ThreadChoice::choose(std::uint64_t key, int wanted) {
  if (wanted <= 1) return 1;
  if (arms_.size() >= kMaxKinds && !arms_.contains(key)) arms_.clear();
  Arms& a = arms_[key];
  int arm = a.current;
  if (--a.countdown <= 0) {
    a.trial = true;
    arm = 1 - a.current;
  }
  return arm == 1 ? wanted : 1;
}

void ThreadChoice::record(std::uint64_t key, int threads, double seconds) {
  const auto it = arms_.find(key);
  if (it == arms_.end()) return;
  Arms& a = it->second;
  const int arm = threads > 1 ? 1 : 0;
  // The current arm keeps a running mean that forgets (one slow run, a page fault or the team's
  // first start, must not decide alone); a trial comes after a long gap, in which the machine's
  // load may have changed, so it replaces what was known of its arm.
  const bool trial_run = a.trial && arm != a.current;
  a.seconds[arm] = a.seen[arm] && !trial_run ? 0.7 * a.seconds[arm] + 0.3 * seconds : seconds;
  a.seen[arm] = true;
  const int other = 1 - arm;
  if (arm == a.current) {
    // The current arm just ran slower than the other one's last known time: the machine's
    // load has changed, so try the other at the next call rather than after the interval.
    if (!a.trial && a.seen[other] && seconds > a.seconds[other]) a.countdown = std::min(a.countdown, 1);
    return;
  }
  if (!trial_run) return;
  a.trial = false;
  if (!a.seen[a.current] || a.seconds[arm] < kSwitchMargin * a.seconds[a.current]) {
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

int choose_threads(std::uint64_t key, int wanted) {
  if (wanted <= 1) return 1;
  std::lock_guard lock(g_mutex);
  return g_choice.choose(key, wanted);
}

void record_threads(std::uint64_t key, int threads, double seconds) {
  std::lock_guard lock(g_mutex);
  g_choice.record(key, threads, seconds);
}

double now_seconds() noexcept {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace tapegrad::detail
