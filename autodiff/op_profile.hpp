// Internal: where a step's time goes, op by op (the benchmark's profile of a training step).
// While an OpProfile lives on a thread, the ops recorded there and their backward passes are
// timed by op name. An op's forward time is the time since the previous op was recorded on the
// thread (ops compute, then record), so work between ops that records nothing is counted to the
// next op; mark() starts that clock again after such work. A product's time goes to the op that
// records next, or whose backward runs it. A node's backward time includes
// sending its gradients on (their sums where several meet). Costs nothing when none lives.
#pragma once

#include <cstdint>
#include <map>
#include <string>

namespace tapegrad::detail {

class OpProfile {
 public:
  // Seconds; the products (ProductTimer) are part of forward and backward and also counted apart.
  struct Times {
    double forward = 0, backward = 0;
    double forward_products = 0, backward_products = 0;
    std::int64_t calls = 0;
  };
  OpProfile();
  ~OpProfile();
  OpProfile(const OpProfile&) = delete;
  OpProfile& operator=(const OpProfile&) = delete;

  void mark();
  const std::map<std::string, Times>& times() const noexcept { return times_; }

  // The tape's calls.
  void recorded(const char* op);
  void backward_ran(const char* op, double seconds);
  void product_ran(double seconds);

 private:
  double last_;
  double products_ = 0;  // since the last op was recorded or ran backward
  std::map<std::string, Times> times_;
  OpProfile* previous_;
};

// The OpProfile living on this thread, or nullptr.
OpProfile* active_profile() noexcept;

// Around a product kernel: its time goes to the thread's OpProfile, if any (a product that
// calls another is counted once). Products that a parallel loop runs on other threads are not.
class ProductTimer {
 public:
  ProductTimer() noexcept;
  ~ProductTimer();
  ProductTimer(const ProductTimer&) = delete;
  ProductTimer& operator=(const ProductTimer&) = delete;

 private:
  double start_ = 0;
  bool active_ = false;
};

}  // namespace tapegrad::detail
