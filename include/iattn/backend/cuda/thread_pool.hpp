// iattn/backend/cuda/thread_pool.hpp: the threads the emulator's launches run on (emulator.hpp),
// kept between launches: creating a block's 128 or 256 threads for every launch cost more than
// running the kernels.
#pragma once

#include <functional>
#include <latch>
#include <memory>
#include <mutex>
#include <semaphore>
#include <thread>
#include <vector>

namespace iattn::simt::emu {

/// The threads the launches run on, kept between launches: run(n, job) runs job(0..n-1) on n
/// distinct threads at once, creating threads only when fewer than n are idle, and returns when
/// all n have finished. Launches from several host threads take disjoint threads.
class thread_pool {
 public:
  static thread_pool& instance() {
    static thread_pool pool;
    return pool;
  }

  void run(unsigned n, const std::function<void(unsigned)>& job) {
    std::vector<worker*> team;
    {
      std::lock_guard lk(mu_);
      while (idle_.size() < n) {  // std::system_error if the system refuses more threads
        auto w = std::make_unique<worker>();
        w->thread = std::thread([p = w.get()] { p->loop(); });
        idle_.push_back(w.get());
        workers_.push_back(std::move(w));
      }
      team.assign(idle_.end() - n, idle_.end());
      idle_.resize(idle_.size() - n);
    }
    std::latch done(n);
    for (unsigned r = 0; r < n; ++r) {
      team[r]->job = &job;
      team[r]->rank = r;
      team[r]->done = &done;
      team[r]->go.release();
    }
    done.wait();
    std::lock_guard lk(mu_);
    idle_.insert(idle_.end(), team.begin(), team.end());
  }

  ~thread_pool() {
    for (auto& w : workers_) {
      w->job = nullptr;
      w->go.release();
    }
    for (auto& w : workers_) w->thread.join();
  }

 private:
  struct worker {
    std::thread thread;
    std::binary_semaphore go{0};
    const std::function<void(unsigned)>* job = nullptr;  // null: stop
    unsigned rank = 0;
    std::latch* done = nullptr;
    void loop() {
      for (;;) {
        go.acquire();
        if (!job) return;
        (*job)(rank);
        done->count_down();
      }
    }
  };
  std::mutex mu_;
  std::vector<std::unique_ptr<worker>> workers_;
  std::vector<worker*> idle_;
};

}  // namespace iattn::simt::emu
