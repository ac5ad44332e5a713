// Static chunking of [0, n) over a few std::threads, for the selection kernels.
//
// Every kernel that runs in parallel cuts its input into the same contiguous
// chunks (chunk t = [t*n/T, (t+1)*n/T)), keeps per-chunk counters, and uses
// prefix sums of those counters to place each chunk's output. So the output
// does not depend on the thread count: the multi-threaded result equals the
// single-threaded one bit for bit.
//
// Threads are started per call (a few tens of microseconds), which is noise
// next to the >= 256K-element inputs that get more than one thread.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <system_error>
#include <thread>
#include <vector>

namespace jss {

//: Below this many elements per thread a kernel runs on one thread.
constexpr int64_t kMinElementsPerThread = int64_t{1} << 18;  // 256K
constexpr int kMaxThreads = 64;

// MPI ranks on this node, from the launcher's environment (MPICH's Hydra:
// MPI_LOCALNRANKS; Open MPI: OMPI_COMM_WORLD_LOCAL_SIZE); 1 outside mpiexec.
inline int64_t local_ranks() {
  for (const char* name : {"MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE"}) {
    if (const char* env = std::getenv(name)) {
      const long v = std::strtol(env, nullptr, 10);
      if (v >= 1) return v;
    }
  }
  return 1;
}

// Threads for an input of n elements: min(hardware threads / MPI ranks on
// the node, n / 256K), at least 1. Sharing the cores matters because every
// parallel pass starts and joins its threads: with P ranks each starting
// all of the node's threads, a pass waits for the slowest of P x threads
// on as many cores (4 ranks on 2 cores: a radix select of 1M entries took
// 2-3x its one-thread time). JSS_NUM_THREADS=<t> overrides the count (read
// per call, so tests can compare thread counts); with an explicit override
// the 256K floor is lowered to 4K per thread so small inputs can be split too.
inline int num_threads_for(int64_t n) {
  int64_t hw = static_cast<int64_t>(std::thread::hardware_concurrency()) / local_ranks();
  int64_t min_per_thread = kMinElementsPerThread;
  if (const char* env = std::getenv("JSS_NUM_THREADS")) {
    const long v = std::strtol(env, nullptr, 10);
    if (v >= 1) {
      hw = v;
      min_per_thread = int64_t{1} << 12;
    }
  }
  hw = std::max<int64_t>(1, std::min<int64_t>(hw, kMaxThreads));
  const int64_t by_size = std::max<int64_t>(1, n / min_per_thread);
  return static_cast<int>(std::min(hw, by_size));
}

// Bounds of chunk t of [0, n) cut into `parts` chunks.
inline int64_t chunk_begin(int64_t n, int parts, int t) {
  // n < 2^31 and parts <= 64: the product fits int64
  return n * t / parts;
}

// Runs fn(t, lo, hi) for t in [0, parts) on `parts` threads (the caller's
// thread takes chunk 0) and waits for all of them.
template <typename Fn>
void parallel_chunks(int64_t n, int parts, Fn&& fn) {
  if (parts <= 1) {
    fn(0, int64_t{0}, n);
    return;
  }
  std::vector<std::thread> workers;
  workers.reserve(static_cast<size_t>(parts - 1));
  int started = 1;
  for (; started < parts; ++started) {
    const int t = started;
    try {
      workers.emplace_back([&fn, n, parts, t] {
        fn(t, chunk_begin(n, parts, t), chunk_begin(n, parts, t + 1));
      });
    } catch (const std::system_error&) {
      break;  // no more threads to be had: the caller's thread does the rest
    }
  }
  fn(0, int64_t{0}, chunk_begin(n, parts, 1));
  for (int t = started; t < parts; ++t) fn(t, chunk_begin(n, parts, t), chunk_begin(n, parts, t + 1));
  for (auto& w : workers) w.join();
}

}  // namespace jss
