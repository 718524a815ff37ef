// Where a step's time goes, op by op (the gpt2 section's profile of a training step), watching
// the tape through its observer hook (autodiff/tape_observer.hpp).
// While an OpProfile lives on a thread, the ops recorded there and their backward passes are
// timed by op name. An op's forward time is the time since the previous op was recorded on the
// thread (ops compute, then record), so work between ops that records nothing is counted to the
// next op. A product's time goes to the op that records next, or whose backward runs it; products
// that a parallel loop runs on other threads are not counted. A node's backward time includes
// sending its gradients on (their sums where several meet).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "autodiff/tape_observer.hpp"

namespace bench {

class OpProfile final : public tapegrad::detail::TapeObserver {
 public:
  // Seconds; the products are part of forward and backward and also counted apart.
  struct Times {
    double forward = 0, backward = 0;
    double forward_products = 0, backward_products = 0;
    std::int64_t calls = 0;
  };
  OpProfile();
  OpProfile(const OpProfile&) = delete;
  OpProfile& operator=(const OpProfile&) = delete;

  const std::map<std::string, Times>& times() const noexcept { return times_; }

  void recorded(const char* op) override;
  void backward_began(const char* op) override;
  void backward_ended(const char* op) override;
  void product_began() override;
  void product_ended() override;

 private:
  double last_;
  double products_ = 0;  // since the last op was recorded or ran backward
  std::vector<double> backward_started_;
  int product_depth_ = 0;  // a product that calls another is counted once
  double product_started_ = 0;
  std::map<std::string, Times> times_;
  tapegrad::detail::ObserveTape watching_{*this};  // last: watches once the rest is ready
};

}  // namespace bench
