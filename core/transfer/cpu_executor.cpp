// Worker threads over two queues: a load task always goes before a save task.
#include "core/transfer/cpu_executor.hpp"

namespace swiftkv {

CpuExecutor::CpuExecutor(unsigned threads) {
  threads_.reserve(threads);
  for (unsigned i = 0; i < threads; ++i) threads_.emplace_back([this] { run(); });
}

CpuExecutor::~CpuExecutor() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (std::thread &t : threads_) t.join();
}

void CpuExecutor::submit(Lane lane, std::function<void()> task) {
  {
    std::lock_guard lock(mu_);
    (lane == Lane::load ? loads_ : saves_).push_back(std::move(task));
  }
  cv_.notify_one();
}

void CpuExecutor::run() {
  for (;;) {
    std::function<void()> task;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [this] { return stop_ || !loads_.empty() || !saves_.empty(); });
      std::deque<std::function<void()>> &q = !loads_.empty() ? loads_ : saves_;
      if (q.empty()) return;  // stopping, and nothing left to run
      task = std::move(q.front());
      q.pop_front();
    }
    task();
  }
}

}  // namespace swiftkv
