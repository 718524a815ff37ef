// The thread that makes every MPI call of a process group, one job after another, and the wait
// on a job's end with the group's timeout.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <thread>

#include "distributed/communicator.hpp"

namespace tapegrad::detail {

class CommThread {
 public:
  CommThread(Communicator& communicator, double timeout_seconds);
  ~CommThread();  // stops the thread once its queue is empty; detaches it if a job never ended
  // Queues `job`; the future ends when it has run (with its exception, if it threw).
  std::future<void> submit(std::function<void(Communicator&)> job);
  // Waits for `done`; a job that threw rethrows here, and one still running after the timeout
  // throws a DistributedError naming `what`. Either leaves the group broken: later waits throw.
  void wait(std::future<void>& done, const std::string& what);
  // Runs `job` on the thread and waits for it. The job must own everything it touches (capture
  // tensors by value, other state by shared_ptr): after a timeout it may still run, later.
  void run(const std::string& what, std::function<void(Communicator&)> job);
  // A DistributedError naming `what` once a collective has failed or timed out.
  void check_usable(const std::string& what) const;
  bool broken() const noexcept { return broken_; }
  // Whether every job queued has run, waiting up to the timeout for the last ones.
  bool drained();
  // Stops taking jobs and lets the thread go without waiting for it (a job stuck in a collective
  // that will never finish); the caller must then keep the thread's objects alive.
  void abandon();

 private:
  void loop();
  Communicator& communicator_;
  double timeout_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::packaged_task<void()>> queue_;
  bool stop_ = false, busy_ = false, broken_ = false;
  std::thread thread_;
};

}  // namespace tapegrad::detail
