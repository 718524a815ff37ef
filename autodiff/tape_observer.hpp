// Internal: a hook for watching what one thread's ops do, for a profiler outside the library
// (the benchmark's op-by-op profile, bench/op_profile.hpp). While an observer watches a thread,
// the tape tells it of each op recorded there and of each node's backward run there, and the
// product kernels of each product run there. When none watches, each hook is a null check.
#pragma once

namespace tapegrad::detail {

class TapeObserver {
 public:
  // An op was recorded: it has just computed its outputs.
  virtual void recorded(const char* op) = 0;
  // Around a node's backward and the sending of its gradients on (op: the node's name). They
  // nest when a backward runs a backward pass of its own.
  virtual void backward_began(const char* op) = 0;
  virtual void backward_ended(const char* op) = 0;
  // Around a product kernel (ObservedProduct); a product that calls another nests.
  virtual void product_began() = 0;
  virtual void product_ended() = 0;

 protected:
  ~TapeObserver() = default;
};

// The observer watching this thread, or nullptr.
TapeObserver* tape_observer() noexcept;

// While one lives, `observer` watches the constructing thread (the previous observer again after).
class ObserveTape {
 public:
  explicit ObserveTape(TapeObserver& observer) noexcept;
  ~ObserveTape();
  ObserveTape(const ObserveTape&) = delete;
  ObserveTape& operator=(const ObserveTape&) = delete;

 private:
  TapeObserver* previous_;
};

// Around a product kernel: tells the thread's observer, if any.
class ObservedProduct {
 public:
  ObservedProduct() noexcept : observer_(tape_observer()) {
    if (observer_ != nullptr) observer_->product_began();
  }
  ~ObservedProduct() {
    if (observer_ != nullptr) observer_->product_ended();
  }
  ObservedProduct(const ObservedProduct&) = delete;
  ObservedProduct& operator=(const ObservedProduct&) = delete;

 private:
  TapeObserver* observer_;
};

}  // namespace tapegrad::detail
