// The CPU executor of the transfer engine: a few threads running copy tasks, loads before saves,
// so that a save or a demotion never delays a load that a layer waits for.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace swiftkv {

// Thread-safe. mu_ guards both queues and stop_. Tasks must not throw; they run on the
// executor's threads in the order of their lane, loads first.
class CpuExecutor {
 public:
  enum class Lane { load, save };
  explicit CpuExecutor(unsigned threads);
  // Runs every task already queued, then joins the threads.
  ~CpuExecutor();
  CpuExecutor(const CpuExecutor &) = delete;
  CpuExecutor &operator=(const CpuExecutor &) = delete;

  void submit(Lane lane, std::function<void()> task);
  unsigned threads() const noexcept { return static_cast<unsigned>(threads_.size()); }

 private:
  void run();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> loads_, saves_;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace swiftkv
