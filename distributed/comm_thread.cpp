// The communication thread (see comm_thread.hpp).
#include "distributed/comm_thread.hpp"

#include <chrono>

#include <fmt/format.h>

#include "autodiff/check.hpp"
#include "tapegrad/distributed/process_group.hpp"

namespace tapegrad::detail {

CommThread::CommThread(Communicator& communicator, double timeout_seconds)
    : communicator_(communicator), timeout_(timeout_seconds), thread_([this] { loop(); }) {}

CommThread::~CommThread() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void CommThread::abandon() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.detach();
}

std::future<void> CommThread::submit(std::function<void(Communicator&)> job) {
  // The job is moved out and destroyed once it has run: the task's shared state lives as long as
  // its future, and a job holding its own future's owner (a bucket) would never be freed.
  std::packaged_task<void()> task([this, job = std::move(job)]() mutable {
    const std::function<void(Communicator&)> run = std::move(job);
    job = nullptr;
    run(communicator_);
  });
  std::future<void> done = task.get_future();
  {
    std::lock_guard lock(mutex_);
    queue_.push_back(std::move(task));
  }
  wake_.notify_all();
  return done;
}

void CommThread::check_usable(const std::string& what) const {
  if (broken_)
    fail<DistributedError>("rank {} of {}: {}: an earlier collective of this process failed or timed out; the processes are out of step, "
                           "so no further collective can run",
                           communicator_.rank(), communicator_.size(), what);
}

void CommThread::wait(std::future<void>& done, const std::string& what) {
  check_usable(what);
  const auto limit = std::chrono::duration<double>(timeout_);
  if (done.wait_for(limit) != std::future_status::ready) {
    broken_ = true;
    fail<DistributedError>("rank {} of {}: {} did not finish within {} s; another process has failed or stalled", communicator_.rank(),
                           communicator_.size(), what, timeout_);
  }
  try {
    done.get();
  } catch (const std::exception& e) {
    broken_ = true;
    // The call that failed (an MPI error names itself and the rank) under the operation it served.
    std::string message = e.what();
    const std::string prefix = fmt::format("rank {} of {}: ", communicator_.rank(), communicator_.size());
    if (message.starts_with(prefix)) message.erase(0, prefix.size());
    fail<DistributedError>("{}{}: {}", prefix, what, message);
  }
}

void CommThread::run(const std::string& what, std::function<void(Communicator&)> job) {
  check_usable(what);
  std::future<void> done = submit(std::move(job));
  wait(done, what);
}

bool CommThread::drained() {
  std::unique_lock lock(mutex_);
  return wake_.wait_for(lock, std::chrono::duration<double>(timeout_), [&] { return queue_.empty() && !busy_; });
}

void CommThread::loop() {
  for (;;) {
    std::packaged_task<void()> task;
    {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and nothing left to run
      task = std::move(queue_.front());
      queue_.pop_front();
      busy_ = true;
    }
    task();
    {
      std::lock_guard lock(mutex_);
      busy_ = false;
    }
    wake_.notify_all();
  }
}

}  // namespace tapegrad::detail
