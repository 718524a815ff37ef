// A thread that keeps one core busy: the case of a machine shared with other work.
#pragma once

#include <pthread.h>
#include <sched.h>

#include <atomic>
#include <thread>

namespace bench {

// A thread spinning on one CPU (the last this process may use) for as long as it lives.
class Spinner {
 public:
  Spinner() : thread_([this] { spin(); }) {
    cpu_set_t allowed;
    CPU_ZERO(&allowed);
    if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0) return;
    int last = -1;
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &allowed)) last = c;
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(last, &one);
    pthread_setaffinity_np(thread_.native_handle(), sizeof(one), &one);
  }
  ~Spinner() {
    stop_ = true;
    thread_.join();
  }
  Spinner(const Spinner&) = delete;
  Spinner& operator=(const Spinner&) = delete;

 private:
  void spin() {
    while (!stop_.load(std::memory_order_relaxed)) {
    }
  }
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace bench
