// iattn/backend/cuda/memory.hpp: device memory.
//
//   cuda_detail::device_buffer<T>   n values, owning, stream-ordered (cudaMallocFromPoolAsync from
//                                   iattn's pool, cudaFreeAsync), or a view of an upload_scope's copy
//   cuda_detail::memory_pool()      iattn's pool on the current device: freed memory stays reserved
//                                   in it (release threshold: unbounded), as PyTorch's caching
//                                   allocator keeps it; release_device_memory() returns it
//   cuda_pool_reserved_bytes()      what the pool holds on the current device (0 when emulated)
//   cuda_detail::upload_scope       one call's coefficient copies, each uploaded once (the channel
//                                   means and materialize_all evaluate every channel in one scope)
//   device_matrix<T>                (rows, cols) row-major on the device, owning, move-only; T is
//                                   float, double, or a 16-bit storage type (float16, bfloat16)
//   to_device(m, cuda{s})           a host Eigen matrix into a new device_matrix (row-major)
//   to_device<S>(m, cuda{s})        a host float matrix rounded to S = float16 or bfloat16 (on the
//                                   host: half the bytes to copy), a value beyond S's range refused
//   to_host(dm)                     a device_matrix into a new Matrix<T> (Matrix<float> for 16-bit
//                                   storage, exact); waits for dm's stream
//
// Emulated build: "device" memory is host memory, filled with 0xFF bytes (NaN) when allocated, as
// a GPU's is left uninitialised: a kernel that leaves an output unwritten shows in the tests.
#pragma once

#include "../../core/config.hpp"
#include "../../core/error.hpp"
#include "kernels/storage16.hpp"
#include "tag.hpp"

#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <type_traits>
#include <utility>
#include <vector>

namespace iattn {

namespace cuda_detail {

/// How many host-to-device copies device_buffer::upload has started in this process (all threads):
/// what the tests count to prove a call copies nothing.
inline std::atomic<long long>& host_to_device_copies() {
  static std::atomic<long long> n{0};
  return n;
}

#if defined(__CUDACC__)
/// iattn's stream-ordered memory pool on the current device, created on first use. The device's
/// default pool returns freed memory to the system at every synchronisation (its release threshold
/// is 0), so a call after a synchronisation maps its temporaries and results again: on an H200 that
/// cost more than the kernels (performance.md). This pool keeps what is freed (threshold unbounded)
/// for the next allocation; release_device_memory() trims it. Shared by every stream and thread.
inline cudaMemPool_t memory_pool() {
  static std::mutex m;
  static std::map<int, cudaMemPool_t> pools;
  int device = 0;
  simt::check(cudaGetDevice(&device), "memory_pool: cudaGetDevice");
  const std::lock_guard<std::mutex> lock(m);
  if (auto it = pools.find(device); it != pools.end()) return it->second;
  cudaMemPoolProps props{};
  props.allocType = cudaMemAllocationTypePinned;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = device;
  cudaMemPool_t pool = nullptr;
  simt::check(cudaMemPoolCreate(&pool, &props), "memory_pool: cudaMemPoolCreate");
  std::uint64_t keep = UINT64_MAX;
  simt::check(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep),
              "memory_pool: cudaMemPoolSetAttribute");
  pools.emplace(device, pool);
  return pool;
}
#endif

}  // namespace cuda_detail

/// Returns the device memory iattn's pool keeps for reuse on the current device (memory of live
/// device matrices and buffers stays): what a process that is done with iattn's GPU calls, or
/// needs the memory elsewhere, calls. Waits for nothing; a no-op in the emulated build.
inline void release_device_memory() {
#if defined(__CUDACC__)
  simt::check(cudaMemPoolTrimTo(cuda_detail::memory_pool(), 0), "release_device_memory: cudaMemPoolTrimTo");
#endif
}

/// The bytes iattn's pool holds on the current device (in use and kept for reuse); 0 when emulated.
inline std::uint64_t cuda_pool_reserved_bytes() {
#if defined(__CUDACC__)
  std::uint64_t n = 0;
  simt::check(cudaMemPoolGetAttribute(cuda_detail::memory_pool(), cudaMemPoolAttrReservedMemCurrent, &n),
              "cuda_pool_reserved_bytes: cudaMemPoolGetAttribute");
  return n;
#else
  return 0;
#endif
}

namespace cuda_detail {

/// n values of T in device memory, allocated and freed in order on a stream (iattn's pool).
template <class T>
class device_buffer {
  static_assert(std::is_trivially_copyable_v<T>, "device_buffer holds trivially copyable values");

 public:
  device_buffer() = default;
  device_buffer(Index n, simt::stream s) : n_(n), stream_(s) {
    if (n_ <= 0) return;
#if defined(__CUDACC__)
    void* p = nullptr;
    simt::check(cudaMallocFromPoolAsync(&p, bytes(), memory_pool(), stream_), "device_buffer: cudaMallocFromPoolAsync");
    data_ = static_cast<T*>(p);
#else
    data_ = static_cast<T*>(::operator new(bytes()));
    std::memset(static_cast<void*>(data_), 0xFF, bytes());
#endif
  }
  /// n values copied from host memory.
  device_buffer(const T* host, Index n, simt::stream s) : device_buffer(n, s) { upload(host); }
  /// A view of n values another owner keeps on the device (an upload_scope): never freed here.
  static device_buffer borrow(T* data, Index n, simt::stream s) {
    device_buffer b;
    b.data_ = data;
    b.n_ = n;
    b.stream_ = s;
    b.owns_ = false;
    return b;
  }
  device_buffer(device_buffer&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)), n_(std::exchange(o.n_, 0)), stream_(o.stream_),
        owns_(std::exchange(o.owns_, true)) {}
  device_buffer& operator=(device_buffer&& o) noexcept {
    if (this != &o) {
      release();
      data_ = std::exchange(o.data_, nullptr);
      n_ = std::exchange(o.n_, 0);
      stream_ = o.stream_;
      owns_ = std::exchange(o.owns_, true);
    }
    return *this;
  }
  device_buffer(const device_buffer&) = delete;
  device_buffer& operator=(const device_buffer&) = delete;
  ~device_buffer() { release(); }

  T* data() { return data_; }
  const T* data() const { return data_; }
  Index size() const { return n_; }
  simt::stream stream() const { return stream_; }

  void upload(const T* host) {
    if (n_ <= 0) return;
    host_to_device_copies().fetch_add(1, std::memory_order_relaxed);
#if defined(__CUDACC__)
    simt::check(cudaMemcpyAsync(data_, host, bytes(), cudaMemcpyHostToDevice, stream_), "device_buffer: upload");
#else
    std::memcpy(static_cast<void*>(data_), host, bytes());
#endif
  }
  /// Copies into host memory and waits for the stream: the values are there on return.
  void download(T* host) const {
    if (n_ <= 0) return;
#if defined(__CUDACC__)
    simt::check(cudaMemcpyAsync(host, data_, bytes(), cudaMemcpyDeviceToHost, stream_), "device_buffer: download");
    simt::check(cudaStreamSynchronize(stream_), "device_buffer: cudaStreamSynchronize");
#else
    std::memcpy(static_cast<void*>(host), data_, bytes());
#endif
  }

 private:
  std::size_t bytes() const { return static_cast<std::size_t>(n_) * sizeof(T); }
  void release() noexcept {
    if (!data_ || !owns_) {
      data_ = nullptr;
      return;
    }
#if defined(__CUDACC__)
    cudaFreeAsync(data_, stream_);  // a destructor does not throw; a failed free is not recoverable
#else
    ::operator delete(static_cast<void*>(data_));
#endif
    data_ = nullptr;
  }

  T* data_ = nullptr;
  Index n_ = 0;
  simt::stream stream_{};
  bool owns_ = true;
};

/// Whether two streams order work the same: the same cudaStream_t; in the emulated build, where
/// every launch completes before it returns, the same schedule (so the tests can tell two apart).
inline bool same_stream(const simt::stream& a, const simt::stream& b) {
#if defined(__CUDACC__)
  return a == b;
#else
  return a.order == b.order;
#endif
}

/// Device copies of an expression's coefficients, keyed by host storage (address and size), on one
/// stream. Shared by the scopes that serve from it (and by a device_expression, which keeps it).
class coefficient_copies {
 public:
  explicit coefficient_copies(simt::stream s) : stream_(s) {}
  simt::stream stream() const { return stream_; }

  /// n values at host, copied to the device on the first request, borrowed after.
  template <class T>
  device_buffer<T> borrow_or_upload(const T* host, Index n) {
    const std::size_t bytes = static_cast<std::size_t>(n) * sizeof(T);
    const std::lock_guard<std::mutex> lock(mutex_);
    for (entry& e : entries_)
      if (e.host == host && e.bytes == bytes) return device_buffer<T>::borrow(reinterpret_cast<T*>(e.copy.data()), n, stream_);
    entries_.push_back(entry{host, bytes, device_buffer<std::byte>(static_cast<Index>(bytes), stream_)});
    entries_.back().copy.upload(reinterpret_cast<const std::byte*>(host));
    return device_buffer<T>::borrow(reinterpret_cast<T*>(entries_.back().copy.data()), n, stream_);
  }
  /// How many distinct coefficients are on the device.
  std::size_t size() const {
    const std::lock_guard<std::mutex> lock(mutex_);
    return entries_.size();
  }

 private:
  struct entry {
    const void* host;
    std::size_t bytes;
    device_buffer<std::byte> copy;
  };
  simt::stream stream_;
  mutable std::mutex mutex_;
  std::vector<entry> entries_;
};

/// The coefficients one call has copied to the device, while it evaluates many channels
/// (materialize_all, the channel and head means): inside a live scope, upload() of a coefficient
/// whose host storage (address and size) the scope already holds borrows that copy instead of
/// copying again. Only an expression's coefficients are uploaded, and the call holds the
/// expression, whose coefficients are immutable: a host address names the same values for the
/// scope's life. Scopes nest (the innermost serves; one per thread); a scope opened inside another
/// on the same stream shares its copies. The copies are freed, in stream order, when the last
/// scope (or device_expression) holding them ends.
class upload_scope {
 public:
  explicit upload_scope(simt::stream s)
      : outer_(current()),
        copies_(outer_ && same_stream(outer_->copies_->stream(), s) ? outer_->copies_
                                                                    : std::make_shared<coefficient_copies>(s)) {
    current() = this;
  }
  /// A scope serving from copies another owner keeps (a device_expression's).
  explicit upload_scope(std::shared_ptr<coefficient_copies> kept) : outer_(current()), copies_(std::move(kept)) {
    current() = this;
  }
  ~upload_scope() { current() = outer_; }
  upload_scope(const upload_scope&) = delete;
  upload_scope& operator=(const upload_scope&) = delete;

  /// The innermost live scope of this thread, or null.
  static upload_scope*& current() {
    static thread_local upload_scope* innermost = nullptr;
    return innermost;
  }
  /// n values at host, copied to the device on the first request, borrowed after.
  template <class T>
  device_buffer<T> borrow_or_upload(const T* host, Index n) {
    return copies_->template borrow_or_upload<T>(host, n);
  }
  /// How many distinct coefficients the scope holds (what the tests count).
  std::size_t uploads() const { return copies_->size(); }

 private:
  upload_scope* outer_;
  std::shared_ptr<coefficient_copies> copies_;
};

/// A coefficient's values on the device (empty when the coefficient is): a new copy, or inside an
/// upload_scope the scope's copy.
template <class C>
auto upload(const C& coefficient, simt::stream s) {
  using T = std::remove_const_t<std::remove_pointer_t<decltype(coefficient.data())>>;
  const Index n = coefficient.rows() * coefficient.cols();
  if (upload_scope* scope = upload_scope::current(); scope && n > 0) return scope->borrow_or_upload<T>(coefficient.data(), n);
  return device_buffer<T>(coefficient.data(), n, s);
}

}  // namespace cuda_detail

/// What a device_matrix holds: the scalar types, and the 16-bit storage types (float16, bfloat16:
/// storage only, computed in float).
template <class T>
concept DeviceValue = Scalar<T> || is_storage16_v<T>;

/// A (rows, cols) row-major matrix in device memory: the CUDA backend's sequence tensors and
/// results. Owning and move-only; freed in order on the stream it was made on.
template <DeviceValue T>
class device_matrix {
 public:
  using Scalar = T;

  device_matrix() = default;
  /// Uninitialised storage for (rows, cols) values on on.stream.
  device_matrix(Index rows, Index cols, cuda on) : buf_(rows * cols, on.stream), rows_(rows), cols_(cols) {
    if (rows < 0 || cols < 0)
      detail::fail("device_matrix", "shape " + detail::shape_string(rows, cols) + " has a negative extent");
  }

  Index rows() const { return rows_; }
  Index cols() const { return cols_; }
  Index size() const { return rows_ * cols_; }
  /// Device pointer to the row-major values.
  T* data() { return buf_.data(); }
  const T* data() const { return buf_.data(); }
  simt::stream stream() const { return buf_.stream(); }
  cuda_detail::device_buffer<T>& buffer() { return buf_; }
  const cuda_detail::device_buffer<T>& buffer() const { return buf_; }

 private:
  cuda_detail::device_buffer<T> buf_;
  Index rows_ = 0, cols_ = 0;
};

/// m (any Eigen dense expression, evaluated once into the row-major layout) in device memory.
template <class XD>
device_matrix<typename XD::Scalar> to_device(const Eigen::MatrixBase<XD>& m, cuda on = {}) {
  using T = typename XD::Scalar;
  const Matrix<T>& host = m.derived();  // no copy when m already is a Matrix<T>
  device_matrix<T> out(host.rows(), host.cols(), on);
  out.buffer().upload(host.data());
  return out;
}

namespace cuda_detail {
template <class S>
constexpr const char* storage_name() {
  return std::is_same_v<S, float16> ? "float16" : "bfloat16";
}
}  // namespace cuda_detail

/// m (a float Eigen expression, evaluated once into the row-major layout) rounded to S = float16 or
/// bfloat16 on the host (round to nearest, ties to even) and copied to the device: half the bytes
/// of a float copy. A finite value that would round to infinity (|v| >= 65520 for float16, above
/// 3.3961e38 for bfloat16) throws std::invalid_argument naming the entry, before anything is
/// copied; NaN and infinities are kept.
template <class S, class XD>
  requires is_storage16_v<S>
device_matrix<S> to_device(const Eigen::MatrixBase<XD>& m, cuda on = {}) {
  static_assert(std::is_same_v<typename XD::Scalar, float>,
                "to_device<float16 / bfloat16>(m, cuda): m must be a float matrix (round a double one to float "
                "first: m.template cast<float>())");
  const Matrix<float>& host = m.derived();
  std::vector<S> narrow(static_cast<std::size_t>(host.size()));
  for (Index i = 0; i < host.size(); ++i) {
    const float v = host.data()[i];
    const S r = round_to<S>(v);
    if (std::isfinite(v) && !std::isfinite(to_float(r))) {
      std::ostringstream msg;
      msg << "m of shape " << detail::shape_string(host.rows(), host.cols()) << " has m(" << i / host.cols() << ", "
          << i % host.cols() << ") = " << v << ", beyond " << cuda_detail::storage_name<S>()
          << "'s largest finite value (" << (std::is_same_v<S, float16> ? "65504" : "3.3895e38")
          << "); scale m, or store it as " << (std::is_same_v<S, float16> ? "bfloat16 or float" : "float");
      detail::fail(std::is_same_v<S, float16> ? "to_device<float16>(m, cuda)" : "to_device<bfloat16>(m, cuda)",
                   msg.str());
    }
    narrow[static_cast<std::size_t>(i)] = r;
  }
  device_matrix<S> out(host.rows(), host.cols(), on);
  out.buffer().upload(narrow.data());
  return out;
}

/// dm's values into out (resized only when its shape differs); waits for dm's stream, so every
/// kernel writing dm has run.
template <Scalar T>
void to_host(const device_matrix<T>& dm, Matrix<T>& out) {
  if (out.rows() != dm.rows() || out.cols() != dm.cols()) out.resize(dm.rows(), dm.cols());
  dm.buffer().download(out.data());
}
template <Scalar T>
Matrix<T> to_host(const device_matrix<T>& dm) {
  Matrix<T> out(dm.rows(), dm.cols());
  to_host(dm, out);
  return out;
}

/// A 16-bit device_matrix's values as floats (exact: every float16 and bfloat16 value is a float)
/// into out; waits for dm's stream.
template <class S>
  requires is_storage16_v<S>
void to_host(const device_matrix<S>& dm, Matrix<float>& out) {
  std::vector<S> narrow(static_cast<std::size_t>(dm.size()));
  dm.buffer().download(narrow.data());
  if (out.rows() != dm.rows() || out.cols() != dm.cols()) out.resize(dm.rows(), dm.cols());
  for (Index i = 0; i < dm.size(); ++i) out.data()[i] = to_float(narrow[static_cast<std::size_t>(i)]);
}
template <class S>
  requires is_storage16_v<S>
Matrix<float> to_host(const device_matrix<S>& dm) {
  Matrix<float> out(dm.rows(), dm.cols());
  to_host(dm, out);
  return out;
}

}  // namespace iattn
