// iattn/backend/cuda/emulator.hpp: the host executor of the SIMT kernels (the emulated build).
//
// A launch of a grid of blocks of T threads runs on T std::threads that walk the blocks in turn:
// all T run block 0, meet at the block's end, then all run block 1, ... (The threads come from a
// pool that keeps them between launches: a launch creates threads only past the pool's size.)
// Within a block they run concurrently, as a GPU runs a block's threads, with
//   - a block barrier (sync_threads) that every thread of the block must reach,
//   - a barrier per warp (32 consecutive threads) for warp shuffles and sync_warp,
//   - per-block shared memory: the dynamic part (launch_config::shared_bytes) and the static
//     arrays declared with IATTN_SHARED, refilled with 0xFF bytes (NaN in float and double) before
//     every block, so a value read before it is written shows.
// Synchronisation is an atomic word per barrier (one per warp and one per block: arrivals, exits,
// generation), released by the last arrival and waited on with std::atomic::wait, so
// ThreadSanitizer orders exactly what a barrier orders: a missing sync_threads between a write
// and another thread's read of the same shared memory is a data race it reports.
//
// Errors a GPU leaves undefined are reported: a barrier that some threads reach while others have
// finished the kernel (divergence), a deadlock (every thread waiting at a barrier that cannot
// complete, e.g. a shuffle some lanes of a warp never reach), a shuffle from a lane that does not
// exist (a partial last warp), static shared memory past 48 KiB, a call outside a launch. The
// launch then throws std::runtime_error naming the kernel.
//
// schedule::serial_forward and serial_reverse run one thread at a time (the others wait for their
// turn), each until its next barrier, in thread order or the reverse: deterministic, and a read of
// another thread's write that lacks a barrier sees the poison or a stale value in one of the two.
//
// Limits: no grid-wide synchronisation, atomics, cooperative groups or dynamic parallelism; shared
// arrays must be declared in the kernel body (a device function called twice would get two arrays
// here, one on the GPU); the whole launch runs before launch() returns (streams are placeholders).
#pragma once

#include "config.hpp"
#include "thread_pool.hpp"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <system_error>
#include <type_traits>
#include <vector>

namespace iattn::simt::emu {

class launch_state;

/// What a thread of the emulator knows about itself while it runs a kernel.
struct thread_context {
  launch_state* run = nullptr;
  unsigned rank = 0;  ///< linear index in the block: x + X (y + Y z)
  dims thread, block;
  std::size_t static_top = 0;  ///< bytes of static shared memory handed out in this block
};

inline thread_local thread_context* current = nullptr;

inline thread_context& context() {
  if (!current) throw std::logic_error("iattn::simt: a SIMT function was called outside a kernel launch");
  return *current;
}

/// The extents CUDA accepts for one launch (compute capability 8.0 and 9.0).
inline void check_config(const char* name, const launch_config& cfg) {
  const auto bad = [&](const std::string& what) {
    throw std::invalid_argument(std::string("launch of ") + name + ": " + what);
  };
  const dims& b = cfg.block;
  const dims& g = cfg.grid;
  if (b.count() == 0 || b.count() > 1024 || b.z > 64)
    bad("block (" + std::to_string(b.x) + ", " + std::to_string(b.y) + ", " + std::to_string(b.z) +
        ") must have 1 to 1024 threads and z <= 64");
  if (g.count() == 0 || g.x > 2147483647u || g.y > 65535 || g.z > 65535)
    bad("grid (" + std::to_string(g.x) + ", " + std::to_string(g.y) + ", " + std::to_string(g.z) +
        ") must be non-empty with y, z <= 65535");
  if (cfg.shared_bytes > 227 * 1024)
    bad("dynamic shared memory of " + std::to_string(cfg.shared_bytes) + " bytes exceeds 227 KiB");
}

/// One launch: the barriers, the shared memory and the block counter its threads share.
class launch_state {
 public:
  static constexpr std::size_t static_shared_capacity = 48 * 1024;  // CUDA's static limit

  launch_state(const char* name, const launch_config& cfg, schedule order)
      : name_(name), cfg_(cfg), order_(order), nthreads_(static_cast<unsigned>(cfg.block.count())),
        nwarps_((nthreads_ + warp_size - 1) / warp_size),
        dynamic_bytes_((cfg.shared_bytes + 15) / 16 * 16),
        arena_(std::make_unique<std::max_align_t[]>((dynamic_bytes_ + static_shared_capacity) /
                                                        sizeof(std::max_align_t) + 1)),
        barriers_(std::make_unique<barrier[]>(nwarps_ + 1)), exchange_(nthreads_),
        waiting_(nthreads_, none), finished_(nthreads_, 0),
        turn_cv_(std::make_unique<std::condition_variable[]>(nthreads_)) {
    barriers_[0].expected = nthreads_;
    for (unsigned w = 0; w < nwarps_; ++w) barriers_[w + 1].expected = lanes_of(w);
    turn_ = order_ == schedule::serial_reverse ? nthreads_ - 1 : 0;
    poison();
  }

  const char* name() const { return name_; }
  const launch_config& config() const { return cfg_; }
  unsigned threads() const { return nthreads_; }
  unsigned lanes_of(unsigned warp) const { return std::min(warp_size, nthreads_ - warp * warp_size); }
  unsigned long long block_index() const { return block_; }
  bool failed() const { return failed_.load(std::memory_order_acquire); }
  std::string error() const {
    std::lock_guard lk(error_mu_);
    return error_;
  }

  // ---- shared memory ---------------------------------------------------------------------------
  std::byte* dynamic_shared() { return reinterpret_cast<std::byte*>(arena_.get()); }
  /// The next static shared array of this thread's block: every thread declares the same arrays
  /// in the same order, so each gets the same address.
  std::byte* static_shared(thread_context& ctx, std::size_t bytes, std::size_t align) {
    const std::size_t off = (ctx.static_top + align - 1) / align * align;
    if (off + bytes > static_shared_capacity)
      throw std::length_error("static shared memory of " + std::to_string(off + bytes) +
                              " bytes exceeds CUDA's 48 KiB");
    ctx.static_top = off + bytes;
    return dynamic_shared() + dynamic_bytes_ + off;
  }
  /// This thread's slot of its warp's shuffle exchange.
  std::uint64_t* exchange(unsigned rank) { return exchange_.data() + rank; }

  // ---- barriers --------------------------------------------------------------------------------
  void sync_block(unsigned rank) { arrive(0, rank, false); }
  void sync_warp(unsigned rank) { arrive(1 + rank / warp_size, rank, false); }
  /// The end of the kernel body for this block: a block barrier that finished threads reach.
  void finish_block(unsigned rank) { arrive(0, rank, true); }

  /// Serial schedules: waits for this thread's first turn.
  void start(unsigned rank) {
    if (order_ == schedule::concurrent) return;
    std::unique_lock lk(serial_mu_);
    turn_cv_[rank].wait(lk, [&] { return failed() || turn_ == rank; });
  }
  /// Serial schedules: this thread has no more blocks; the turn moves on.
  void leave(unsigned rank) {
    if (order_ == schedule::concurrent) return;
    std::unique_lock lk(serial_mu_);
    finished_[rank] = 1;
    if (turn_ == rank) pass_turn(rank);
  }

  /// Records the first error and releases every waiting thread; the launch then throws it.
  void fail(const std::string& what) {
    {
      std::lock_guard lk(error_mu_);
      if (error_.empty()) error_ = what;
    }
    failed_.store(true, std::memory_order_release);
    for (unsigned b = 0; b <= nwarps_; ++b) {  // a new generation: no waiter sleeps through it
      barriers_[b].state.fetch_add(std::uint64_t(1) << 32, std::memory_order_acq_rel);
      barriers_[b].state.notify_all();
    }
    std::lock_guard lk(serial_mu_);
    for (unsigned t = 0; t < nthreads_; ++t) turn_cv_[t].notify_all();
  }

 private:
  static constexpr unsigned none = ~0u;

  struct barrier {
    // concurrent schedule: generation << 32 | exits << 16 | arrivals (at most 1024 threads)
    std::atomic<std::uint64_t> state{0};
    unsigned expected = 0;
    unsigned arrived = 0, exits = 0;  // serial schedules (under serial_mu_)
  };

  void poison() {
    std::memset(arena_.get(), 0xFF, dynamic_bytes_ + static_shared_capacity);
  }

  /// The last arrival at barrier b, with `exits` of its arrivals at the end of the kernel: checks
  /// that the block's threads agree on what they reached, and after a block's end moves every
  /// thread to the next block. Returns an error, or "".
  std::string complete(unsigned b, unsigned exits) {
    const unsigned expected = barriers_[b].expected;
    std::string err;
    if (exits != 0 && exits != expected)
      err = std::to_string(expected - exits) + " thread(s) wait at sync_threads while " + std::to_string(exits) +
            " finished the kernel (every thread of a block must reach each barrier)";
    if (b == 0 && exits == expected) {
      ++block_;
      poison();
    }
    return err;
  }

  void arrive(unsigned b, unsigned rank, bool exit) {
    if (order_ == schedule::concurrent) return arrive_concurrent(b, exit);
    arrive_serial(b, rank, exit);
  }

  void arrive_concurrent(unsigned b, bool exit) {
    if (failed()) return;
    barrier& br = barriers_[b];
    const std::uint64_t old =
        br.state.fetch_add(1 + (exit ? std::uint64_t(1) << 16 : 0), std::memory_order_acq_rel);
    if ((old & 0xFFFF) + 1 == br.expected) {
      // Waiters are uncounted before they are released (see blocked_).
      blocked_.fetch_sub(static_cast<int>(br.expected) - 1, std::memory_order_relaxed);
      const std::string err = complete(b, static_cast<unsigned>((old >> 16) & 0xFFFF) + (exit ? 1 : 0));
      br.state.store(((old >> 32) + 1) << 32, std::memory_order_release);
      br.state.notify_all();
      if (!err.empty()) fail(err);
      return;
    }
    if (blocked_.fetch_add(1, std::memory_order_relaxed) + 1 == static_cast<int>(nthreads_)) {
      fail(deadlock_message());
      return;
    }
    const std::uint64_t gen = old >> 32;
    for (;;) {
      const std::uint64_t cur = br.state.load(std::memory_order_acquire);
      if ((cur >> 32) != gen || failed()) return;
      br.state.wait(cur, std::memory_order_acquire);
    }
  }

  void arrive_serial(unsigned b, unsigned rank, bool exit) {
    std::unique_lock lk(serial_mu_);
    if (failed()) return;
    barrier& br = barriers_[b];
    ++br.arrived;
    if (exit) ++br.exits;
    waiting_[rank] = b;
    std::string err;
    if (br.arrived == br.expected) {
      err = complete(b, br.exits);
      br.arrived = br.exits = 0;
      for (unsigned t = 0; t < nthreads_; ++t)
        if (waiting_[t] == b) waiting_[t] = none;
    }
    if (!err.empty()) {
      lk.unlock();
      fail(err);
      return;
    }
    if (!pass_turn(rank)) {
      lk.unlock();
      fail(deadlock_message());
      return;
    }
    turn_cv_[rank].wait(lk, [&] { return failed() || (waiting_[rank] == none && turn_ == rank); });
  }

  /// Gives the turn to the next thread that can run, after `rank` in the schedule's order (rank
  /// itself last). False when none can: a deadlock.
  bool pass_turn(unsigned rank) {
    for (unsigned i = 1; i <= nthreads_; ++i) {
      const unsigned t = order_ == schedule::serial_forward ? (rank + i) % nthreads_
                                                            : (rank + nthreads_ - i) % nthreads_;
      if (!finished_[t] && waiting_[t] == none) {
        turn_ = t;
        turn_cv_[t].notify_one();
        return true;
      }
    }
    return std::all_of(finished_.begin(), finished_.end(), [](char f) { return f != 0; });
  }

  std::string deadlock_message() const {
    return "deadlock: every thread of block " + std::to_string(block_) +
           " waits at a barrier that cannot complete (a warp shuffle or sync_warp that some lanes "
           "never reach, or a sync_threads skipped by some threads)";
  }

  const char* name_;
  launch_config cfg_;
  schedule order_;
  unsigned nthreads_, nwarps_;
  std::size_t dynamic_bytes_;
  std::unique_ptr<std::max_align_t[]> arena_;  // dynamic part, then the static arrays
  std::unique_ptr<barrier[]> barriers_;        // [0]: the block, [1 + w]: warp w
  std::vector<std::uint64_t> exchange_;        // shuffle slots, one per thread
  // Threads waiting at a barrier (concurrent schedule): an arrival that does not complete its
  // barrier adds itself, the completing one subtracts the waiters it releases. When an addition
  // makes it T, no thread runs and none can complete a barrier: a deadlock. (A released thread
  // may add itself after the subtraction; the count is then briefly low, never high.)
  std::atomic<int> blocked_{0};
  unsigned long long block_ = 0;               // the block being run (linear), advanced at its end
  // serial schedules: one mutex, a condition variable per thread, the turn
  std::mutex serial_mu_;
  std::vector<unsigned> waiting_;  // the barrier each thread waits at, or none
  std::vector<char> finished_;
  std::unique_ptr<std::condition_variable[]> turn_cv_;
  unsigned turn_ = 0;
  std::atomic<bool> failed_{false};
  mutable std::mutex error_mu_;
  std::string error_;
};

inline dims unflatten(unsigned long long i, const dims& extent) {
  dims d;
  d.x = static_cast<unsigned>(i % extent.x);
  i /= extent.x;
  d.y = static_cast<unsigned>(i % extent.y);
  d.z = static_cast<unsigned>(i / extent.y);
  return d;
}

/// A kernel call without its type: what run_body calls in every thread (the launch's lambda
/// outlives the call), so that the launch machinery below is compiled once, not once per kernel.
struct body_ref {
  void* object;
  void (*call)(void*);
  void operator()() const { call(object); }
};

/// Runs `body` (the kernel call) as the grid of cfg: block.count() threads walk the blocks in
/// turn. Returns when every block has run; throws std::runtime_error on an error a GPU would
/// leave undefined (see the header comment), std::invalid_argument on a launch CUDA would reject.
inline void run_body(const char* name, const launch_config& cfg, schedule order, body_ref body) {
  check_config(name, cfg);
  launch_state st(name, cfg, order);
  const unsigned long long nblocks = cfg.grid.count();
  const std::function<void(unsigned)> worker = [&](unsigned rank) {
    thread_context ctx;
    ctx.run = &st;
    ctx.rank = rank;
    ctx.thread = unflatten(rank, cfg.block);
    current = &ctx;
    st.start(rank);
    for (;;) {
      const unsigned long long b = st.block_index();
      if (b >= nblocks || st.failed()) break;
      ctx.block = unflatten(b, cfg.grid);
      ctx.static_top = 0;
      try {
        body();
      } catch (const std::exception& e) {
        st.fail(std::string("thread ") + std::to_string(rank) + " threw: " + e.what());
      } catch (...) {
        st.fail("thread " + std::to_string(rank) + " threw");
      }
      st.finish_block(rank);
    }
    st.leave(rank);
    current = nullptr;
  };
  try {
    thread_pool::instance().run(st.threads(), worker);
  } catch (const std::system_error& e) {
    throw std::runtime_error(std::string("emulated kernel ") + name + ": could not start the block's " +
                             std::to_string(st.threads()) + " threads: " + e.what());
  }
  if (st.failed()) throw std::runtime_error(std::string("emulated kernel ") + name + ": " + st.error());
}

/// run_body for any callable `body` (the kernel call).
template <class Body>
void run(const char* name, const launch_config& cfg, schedule order, Body&& body) {
  using B = std::remove_reference_t<Body>;
  run_body(name, cfg, order, body_ref{const_cast<void*>(static_cast<const void*>(&body)), [](void* p) { (*static_cast<B*>(p))(); }});
}

// ---- the SIMT functions' emulated bodies (simt.hpp forwards to these) ----------------------------

template <class Array>
Array& shared_static() {
  static_assert(std::is_trivially_copyable_v<std::remove_all_extents_t<Array>>,
                "IATTN_SHARED: shared arrays hold trivially copyable values");
  thread_context& ctx = context();
  return *reinterpret_cast<Array*>(ctx.run->static_shared(ctx, sizeof(Array), alignof(Array)));
}

/// __shfl_*_sync with a full mask: every lane of the warp deposits its value, the warp meets,
/// each reads lane `src` (its own value when src < 0), and the warp meets again before the slots
/// are reused.
template <class V>
V shuffle(V v, int src) {
  static_assert(std::is_trivially_copyable_v<V> && sizeof(V) <= 8, "shuffles move values of at most 8 bytes");
  thread_context& ctx = context();
  launch_state& st = *ctx.run;
  std::memcpy(st.exchange(ctx.rank), &v, sizeof(V));
  st.sync_warp(ctx.rank);
  V r = v;
  // A failed launch releases the warp's meeting early: the other lanes may not have deposited
  // (reading their slots would race with the deposits); the launch throws anyway.
  if (st.failed()) return r;
  const unsigned warp = ctx.rank / warp_size;
  if (src >= 0) {
    if (static_cast<unsigned>(src) >= st.lanes_of(warp))
      st.fail("shuffle from lane " + std::to_string(src) + " of warp " + std::to_string(warp) + ", which has " +
              std::to_string(st.lanes_of(warp)) + " lanes (the block's last warp is partial; full-mask shuffles " +
              "need whole warps)");
    else
      std::memcpy(&r, st.exchange(warp * warp_size + static_cast<unsigned>(src)), sizeof(V));
  }
  st.sync_warp(ctx.rank);
  return r;
}

}  // namespace iattn::simt::emu
