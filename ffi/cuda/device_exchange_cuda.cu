// The CUDA Device of the device-resident sparse exchange
// (ffi/collectives/device_exchange.h): its kernels run the per-slot and per-entry
// functions of ffi/collectives/exchange_steps.h (which the CPU seam runs in loops,
// ffi/collectives/device_exchange_host.h), its copies are cudaMemcpyAsync on XLA's
// stream, its device memory comes from XLA's scratch allocator and its host
// buffers are pinned, one growing allocation per slot and thread, sized by what
// the call moves (O(k P) entries), never by N.
#include "ffi/cuda/device_exchange_cuda.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cub/cub.cuh>
#include <string>
#if defined(__x86_64__) || defined(__SSE2__)
#include <xmmintrin.h>
#endif

#include "ffi/collectives/device_exchange.h"
#include "ffi/collectives/exchange_steps.h"
#include "ffi/cuda/cuda_ffi_common.cuh"

namespace jss {
namespace exchange {
namespace {

namespace ffi = xla::ffi;

constexpr const char* kOp = "sparse_allreduce";
constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 4096;  // grid-stride loops beyond

unsigned blocks_for(int64_t items) {
  return static_cast<unsigned>(
      std::max<int64_t>(1, std::min<int64_t>((items + kThreads - 1) / kThreads, kMaxBlocks)));
}

__device__ int64_t first_item() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ int64_t item_stride() { return static_cast<int64_t>(gridDim.x) * blockDim.x; }

__device__ void max_key(uint64_t* key, uint64_t value) {
  atomicMax(reinterpret_cast<unsigned long long*>(key), static_cast<unsigned long long>(value));
}

// Step 1a: every slot checked (the first bad one by an atomic maximum of its key,
// finiteness by one flag) and written as a wire entry for the compaction.
__global__ void inspect_slots(const float* values, const int32_t* indices, int64_t cap,
                              int64_t size, SparseEntry* slots, SlotReport* report) {
  bool nonfinite = false;
  for (int64_t i = first_item(); i < cap; i += item_stride()) {
    const float v = values[i];
    const int32_t index = indices[i];
    slots[i] = slot_entry(v, index);
    if (slot_index_bad(index, size)) {
      max_key(&report->bad_position_key, bad_position_key(i));
    } else {
      nonfinite |= slot_nonfinite(v, index, size);
    }
  }
  if (nonfinite) atomicOr(&report->nonfinite, 1u);
}

// Step 1c: the kept entries' order (strictly increasing, else the host merges),
// and the first bad slot's index for the error message.
__global__ void check_kept(const SparseEntry* kept, const int32_t* indices, SlotReport* report) {
  const int64_t count = report->count;
  bool unsorted = false;
  for (int64_t j = first_item() + 1; j < count; j += item_stride()) {
    unsorted |= out_of_order(kept, j);
  }
  if (unsorted) atomicOr(&report->unsorted, 1u);
  if (first_item() == 0 && report->bad_position_key != 0) {
    report->bad_index = indices[bad_position_of(report->bad_position_key)];
  }
}

// Step 1d: the kept values rounded to a 16-bit wire dtype (entries in order only:
// out of order, the host merges duplicates in float32 first, then rounds).
__global__ void round_kept(SparseEntry* kept, const SlotReport* report, int64_t dtype) {
  if (report->unsorted) return;
  const int64_t count = report->count;
  for (int64_t j = first_item(); j < count; j += item_stride()) {
    kept[j].value = wire_rounded(kept[j].value, dtype);
  }
}

// Step 3: one run added into out (its indices unique: no two threads meet), a
// peer's run checked entry by entry, the nonzero count's change summed.
__global__ void add_run_kernel(float* out, int64_t n, const SparseEntry* run, int64_t count,
                               int64_t run_id, bool check, RunReport* report) {
  using Reduce = cub::BlockReduce<long long, kThreads>;
  __shared__ typename Reduce::TempStorage temp;
  long long delta = 0;
  for (int64_t i = first_item(); i < count; i += item_stride()) {
    if (check && entry_faulty(run, i, n)) {
      max_key(&report->fault_key, fault_key(run_id, i));
      continue;
    }
    delta += add_entry(out, run[i]);
  }
  const long long block = Reduce(temp).Sum(delta);
  if (threadIdx.x == 0 && block != 0) {
    atomicAdd(reinterpret_cast<unsigned long long*>(&report->nnz),
              static_cast<unsigned long long>(block));  // two's complement: a negative sum too
  }
}

// Step 4: a host algorithm's result entries (unique indices) stored into out.
__global__ void store_entries_kernel(float* out, const SparseEntry* entries, int64_t count) {
  for (int64_t i = first_item(); i < count; i += item_stride()) {
    out[entries[i].index] = entries[i].value;
  }
}

struct StatsWords {
  int64_t field[WireStats::kFields];
};

// Step 5: the statistics, the device's nonzero count in field 3 where it has one.
template <typename Int>
__global__ void write_stats_kernel(Int* out, StatsWords words, const RunReport* report) {
  if (first_item() != 0) return;
  if (report != nullptr) words.field[3] = report->nnz;
  for (int f = 0; f < WireStats::kFields; ++f) write_stats_field(out, f, words.field[f]);
}

// Pinned host memory that grows (by 1.5x at least: cudaHostAlloc costs
// milliseconds, so it is kept across calls) and is never shrunk.
class PinnedBuffer {
 public:
  ~PinnedBuffer() {
    if (base_ != nullptr) (void)cudaFreeHost(base_);  // at exit the runtime may be gone
  }
  cudaError_t reserve(size_t bytes, void** out) {
    if (bytes > capacity_) {
      const size_t grown = std::max(bytes, capacity_ + capacity_ / 2);
      if (base_ != nullptr) {
        const cudaError_t rc = cudaFreeHost(base_);
        base_ = nullptr;
        capacity_ = 0;
        if (rc != cudaSuccess) return rc;
      }
      const cudaError_t rc = cudaHostAlloc(&base_, grown, cudaHostAllocPortable);
      if (rc != cudaSuccess) return rc;
      capacity_ = grown;
    }
    *out = base_;
    return cudaSuccess;
  }

 private:
  void* base_ = nullptr;
  size_t capacity_ = 0;
};

// The host half of the call (the header check, a host algorithm's merges) in the
// floating-point mode of the CPU handlers: XLA's CPU runtime runs them with
// subnormals flushed to zero (x86 MXCSR FTZ + DAZ), this thread may not.
class CpuFloatMode {
 public:
#if defined(__x86_64__) || defined(__SSE2__)
  CpuFloatMode() : saved_(_mm_getcsr()) { _mm_setcsr(saved_ | 0x8040u); }  // FTZ | DAZ
  ~CpuFloatMode() { _mm_setcsr(saved_); }

 private:
  unsigned saved_;
#endif
};

ffi::Error check(cudaError_t rc, const char* what) {
  if (rc == cudaSuccess) return ffi::Error::Success();
  return ffi::Error::Internal(std::string("jax_sparse_sync.") + kOp + " (CUDA): " + what +
                              " failed: " + cudaGetErrorName(rc) + ": " + cudaGetErrorString(rc));
}

class CudaDevice {
 public:
  CudaDevice(cudaStream_t stream, ffi::ScratchAllocator& scratch)
      : stream_(stream), scratch_(scratch) {}

  ffi::Error device_buffer(size_t bytes, void** out) {
    return cuda_ffi::allocate_scratch(scratch_, bytes, kOp, out);
  }
  ffi::Error host_buffer(int slot, size_t bytes, void** out) {
    thread_local PinnedBuffer buffers[3];
    return check(buffers[slot].reserve(std::max<size_t>(bytes, 1), out), "cudaHostAlloc");
  }
  ffi::Error clear(void* p, size_t bytes) {
    return check(cudaMemsetAsync(p, 0, bytes, stream_), "cudaMemsetAsync");
  }

  ffi::Error prepare_local(const DeviceCall& call, int64_t size, int64_t value_dtype,
                           SparseEntry* slots, SparseEntry* kept, SlotReport* report) {
    const unsigned blocks = blocks_for(call.cap);
    if (call.cap > 0) {
      inspect_slots<<<blocks, kThreads, 0, stream_>>>(call.values, call.indices, call.cap, size,
                                                      slots, report);
      if (auto e = check(cudaGetLastError(), "the slot check kernel"); e.failure()) return e;
      if (auto e = compact(slots, kept, call.cap, &report->count); e.failure()) return e;
    }
    check_kept<<<blocks, kThreads, 0, stream_>>>(kept, call.indices, report);
    if (auto e = check(cudaGetLastError(), "the order check kernel"); e.failure()) return e;
    if (value_dtype == 0 || call.cap == 0) return ffi::Error::Success();
    round_kept<<<blocks, kThreads, 0, stream_>>>(kept, report, value_dtype);
    return check(cudaGetLastError(), "the wire rounding kernel");
  }

  ffi::Error to_host(void* host, const void* device, size_t bytes) {
    if (bytes == 0) return ffi::Error::Success();
    return check(cudaMemcpyAsync(host, device, bytes, cudaMemcpyDeviceToHost, stream_),
                 "cudaMemcpyAsync (device to host)");
  }
  ffi::Error to_device(void* device, const void* host, size_t bytes) {
    if (bytes == 0) return ffi::Error::Success();
    return check(cudaMemcpyAsync(device, host, bytes, cudaMemcpyHostToDevice, stream_),
                 "cudaMemcpyAsync (host to device)");
  }
  ffi::Error synchronize() { return check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize"); }

  ffi::Error zero_floats(float* out, int64_t n) {
    // +0.0f is all zero bits: the CPU path's zeros
    return clear(out, static_cast<size_t>(n) * sizeof(float));
  }

  ffi::Error add_run(float* out, int64_t n, const SparseEntry* run, int64_t count, int64_t run_id,
                     bool check_run, RunReport* report) {
    if (count == 0) return ffi::Error::Success();
    add_run_kernel<<<blocks_for(count), kThreads, 0, stream_>>>(out, n, run, count, run_id,
                                                               check_run, report);
    return check(cudaGetLastError(), "the run sum kernel");
  }

  ffi::Error store_entries(float* out, const SparseEntry* entries, int64_t count) {
    if (count == 0) return ffi::Error::Success();
    store_entries_kernel<<<blocks_for(count), kThreads, 0, stream_>>>(out, entries, count);
    return check(cudaGetLastError(), "the result store kernel");
  }

  ffi::Error write_stats(const DeviceCall& call, const WireStats& stats, const RunReport* report) {
    StatsWords words;
    stats.write(words.field);
    if (call.stats_s64) {
      write_stats_kernel<<<1, 1, 0, stream_>>>(static_cast<int64_t*>(call.stats), words, report);
    } else {
      write_stats_kernel<<<1, 1, 0, stream_>>>(static_cast<int32_t*>(call.stats), words, report);
    }
    return check(cudaGetLastError(), "the statistics kernel");
  }

 private:
  // Step 1b: the kept slots (index >= 0) in slot order, their count on the device.
  ffi::Error compact(const SparseEntry* slots, SparseEntry* kept, int64_t cap, int64_t* count) {
    size_t bytes = 0;
    if (auto e = check(cub::DeviceSelect::If(nullptr, bytes, slots, kept, count, cap, KeepSlot(),
                                             stream_),
                       "cub::DeviceSelect::If (size)");
        e.failure()) {
      return e;
    }
    void* temp = nullptr;
    if (auto e = device_buffer(bytes, &temp); e.failure()) return e;
    return check(cub::DeviceSelect::If(temp, bytes, slots, kept, count, cap, KeepSlot(), stream_),
                 "cub::DeviceSelect::If");
  }

  cudaStream_t stream_;
  ffi::ScratchAllocator& scratch_;
};

}  // namespace
}  // namespace exchange

xla::ffi::Error sparse_allreduce_cuda(cudaStream_t stream, xla::ffi::ScratchAllocator& scratch,
                                      const float* values, const int32_t* indices, int64_t cap,
                                      float* out, void* stats, bool stats_s64,
                                      const CallConfig& config, MPI_Comm comm) {
  exchange::CpuFloatMode float_mode;
  exchange::CudaDevice dev(stream, scratch);
  exchange::DeviceCall call;
  call.values = values;
  call.indices = indices;
  call.cap = cap;
  call.out = out;
  call.stats = stats;
  call.stats_s64 = stats_s64;
  return exchange::sparse_allreduce_on_device(dev, call, config, comm);
}

}  // namespace jss
