// Internal: whether parallel work runs on the team or on the calling thread, decided from what
// each kind of work actually took lately rather than from its size alone.
//
// The size rules (parallel_for's grain, a product's 2^24 multiply-adds per thread) say when a
// second thread pays on an idle machine. When another process holds a core, the same split can
// cost several times the serial run: every join waits for a thread the scheduler has parked,
// and libgomp's waiting threads spin on the cores the working ones need (README, "Threads").
// No call can change libgomp's wait policy once it has loaded, so tapegrad measures instead:
// each kind of work (a product's layout, a loop's size class) keeps a running time for one
// thread and for the team, runs the faster one, and now and then tries the other, less often
// each time the choice holds, and at once when the current choice runs slower than the other
// did. On an idle machine the team keeps winning and the trials are
// rare; next to a busy process the single thread wins and the split is tried only at
// ever longer intervals.
#pragma once

#include <cstdint>
#include <unordered_map>

namespace tapegrad::detail {

// The policy, apart from clocks and locks so that tests can drive it with chosen times.
class ThreadChoice {
 public:
  // Calls between trials of the other arm: the first after kFirstInterval, then growing
  // kIntervalGrowth-fold while the current arm keeps winning, up to kMaxInterval. A trial of
  // the losing arm costs a whole slow run, and a benchmark of tens of steps must not pay many;
  // a change of load is caught by the current arm's own slowdown, not by the trials.
  // The first trial comes at the second call: until one thread's time is known, a team that the
  // machine cannot give is not noticed, and its runs may each take a scheduler slice.
  static constexpr int kFirstInterval = 2;
  static constexpr int kIntervalGrowth = 4;
  static constexpr int kMaxInterval = 1024;
  // The other arm takes over when it is this much faster: measurements on a shared machine
  // wobble by a few percent, and a switch costs a trial to undo.
  static constexpr double kSwitchMargin = 0.95;

  // The thread count for the next run of work `key`, which the size rule would give `wanted`
  // threads (> 1): `wanted` or 1.
  int choose(std::uint64_t key, int wanted);
  // What that run took, in seconds, with `threads` threads.
  void record(std::uint64_t key, int threads, double seconds);
  // Kinds of work seen; the table is cleared when it reaches kMaxKinds.
  std::size_t kinds() const noexcept { return arms_.size(); }
  static constexpr std::size_t kMaxKinds = 4096;

 private:
  struct Arms {
    double seconds[2] = {0.0, 0.0};  // running times: [0] one thread, [1] the team
    bool seen[2] = {false, false};
    int current = 1;  // the size rule's choice first
    int interval = kFirstInterval;
    int countdown = kFirstInterval;
    bool trial = false;  // the next record is a trial of the other arm
  };
  std::unordered_map<std::uint64_t, Arms> arms_;
};

// The process-wide instance behind the helpers below, locked.
int choose_threads(std::uint64_t key, int wanted);
void record_threads(std::uint64_t key, int threads, double seconds);

// Seconds on a monotonic clock, for record_threads.
double now_seconds() noexcept;

// Mixes v into a key (FNV-1a over 64-bit words).
constexpr std::uint64_t mix_key(std::uint64_t key, std::uint64_t v) noexcept {
  return (key ^ v) * 0x100000001b3ULL;
}
inline constexpr std::uint64_t kKeySeed = 0xcbf29ce484222325ULL;

}  // namespace tapegrad::detail
