// MPI collectives on GPU buffers, as XLA FFI handlers of the CUDA module.
//
// Same names, signatures and semantics as the CPU handlers. The sparse
// allreduce runs the device-resident exchange (ffi/collectives/device_exchange.h,
// ffi/cuda/device_exchange_cuda.cu) for every algorithm but dense and DSAR: the
// input checked and compacted on the device, O(k) bytes through pinned memory,
// the allgather's sums formed on the device. For the others the collective
// itself is the CPU code (jss_collectives), run on host copies. Each handler
//   1. copies its inputs to pinned host buffers with cudaMemcpyAsync on XLA's
//      stream (for dense / DSAR and Ok-Topk only the k-sized COO
//      inputs; block_allreduce's input is the dense vector by definition),
//   2. synchronizes that stream, so MPI reads finished copies,
//   3. runs the CPU implementation on host pointers,
//   4. copies the outputs (dense result, masks, statistics) back on the same
//      stream and synchronizes again before the staging buffers are reused;
//      Ok-Topk's result comes back as its O(k P) entries, which a kernel stores
//      into the zeroed output (sparse_result_cuda.cu), instead of N floats.
// The non-blocking pair does the same around the CPU worker-thread machinery
// (start: copy in, check, launch; done: wait, copy out). The CPU and CUDA
// modules each keep their own table of operations: finish an operation on the
// platform that started it.
// Because they synchronize, these handlers do not declare command-buffer
// (CUDA graph) compatibility.
#include <cuda_runtime.h>
#include <mpi.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <string>
#include <vector>

#include "ffi/collectives/algorithms.h"
#include "ffi/collectives/allgather_bytes.h"
#include "ffi/collectives/allreduce_call.h"
#include "ffi/collectives/collectives_host.h"
#include "ffi/collectives/device_exchange.h"
#include "ffi/cuda/cuda_handlers.h"
#include "ffi/cuda/device_exchange_cuda.h"
#include "ffi/runtime/mpi_comm.h"
#include "ffi/handlers/signatures.h"
#include "ffi/cuda/sparse_result_cuda.h"
#include "ffi/runtime/watchdog.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace jss {
namespace {

ffi::Error cuda_error(cudaError_t code, const char* op, const char* call) {
  return ffi::Error(ffi::ErrorCode::kInternal,
                    std::string("jax_sparse_sync.") + op + " (CUDA): " + call + " failed: " +
                        cudaGetErrorName(code) + ": " + cudaGetErrorString(code));
}

#define JSS_CUDA_CHECK(expr, op, call)                                       \
  do {                                                                       \
    cudaError_t _jss_cuda_rc = (expr);                                       \
    if (_jss_cuda_rc != cudaSuccess) return cuda_error(_jss_cuda_rc, op, call); \
  } while (0)

// Pinned host memory for staging, one growing allocation per thread, carved
// into aligned pieces for each call. cudaHostAlloc costs milliseconds, more
// than copying k-sized data, so it is reused across calls. Every handler
// synchronizes its stream before returning, and MPI errors happen between the
// synchronize after the copies in and the first copy out, so no copy is in
// flight when the thread's next call reuses the buffer (only a failing CUDA
// call returns with copies queued, and that error is sticky for the context).
class PinnedStaging {
 public:
  ~PinnedStaging() {
    // At process exit the CUDA runtime may already be unloaded: nothing to do then.
    if (base_ != nullptr) (void)cudaFreeHost(base_);
  }

  // Pointers to pieces of the given sizes (bytes), each 256-byte aligned.
  ffi::Error carve(const char* op, std::initializer_list<size_t> sizes, std::vector<char*>* out) {
    size_t total = 0;
    for (size_t s : sizes) total += round_up(s);
    if (total > capacity_) {
      // 1.5x: a few reallocations at most while sizes grow, without
      // doubling a large pinned (unpageable) allocation.
      const size_t grown = std::max(total, capacity_ + capacity_ / 2);
      if (base_ != nullptr) {
        JSS_CUDA_CHECK(cudaFreeHost(base_), op, "cudaFreeHost");
        base_ = nullptr;
        capacity_ = 0;
      }
      void* p = nullptr;
      JSS_CUDA_CHECK(cudaHostAlloc(&p, grown, cudaHostAllocPortable), op, "cudaHostAlloc");
      base_ = static_cast<char*>(p);
      capacity_ = grown;
    }
    out->clear();
    size_t offset = 0;
    for (size_t s : sizes) {
      out->push_back(base_ + offset);
      offset += round_up(s);
    }
    return ffi::Error::Success();
  }

 private:
  static size_t round_up(size_t bytes) { return (bytes + 255) / 256 * 256; }
  char* base_ = nullptr;
  size_t capacity_ = 0;
};

PinnedStaging& staging() {
  thread_local PinnedStaging instance;
  return instance;
}

ffi::Error to_host(void* host, const void* device, size_t bytes, cudaStream_t stream,
                   const char* op) {
  if (bytes == 0) return ffi::Error::Success();
  JSS_CUDA_CHECK(cudaMemcpyAsync(host, device, bytes, cudaMemcpyDeviceToHost, stream), op,
                 "cudaMemcpyAsync (device to host)");
  return ffi::Error::Success();
}

ffi::Error to_device(void* device, const void* host, size_t bytes, cudaStream_t stream,
                     const char* op) {
  if (bytes == 0) return ffi::Error::Success();
  JSS_CUDA_CHECK(cudaMemcpyAsync(device, host, bytes, cudaMemcpyHostToDevice, stream), op,
                 "cudaMemcpyAsync (host to device)");
  return ffi::Error::Success();
}

ffi::Error synchronize(cudaStream_t stream, const char* op) {
  JSS_CUDA_CHECK(cudaStreamSynchronize(stream), op, "cudaStreamSynchronize");
  return ffi::Error::Success();
}

#define JSS_RETURN_IF_ERROR(expr)         \
  do {                                    \
    ffi::Error _jss_err = (expr);         \
    if (_jss_err.failure()) return _jss_err; \
  } while (0)

// Pinned memory for a sparse result's entries, apart from the call's staging
// buffer (whose pieces still hold the call's other outputs): one per thread,
// grown like PinnedStaging.
PinnedStaging& result_staging() {
  thread_local PinnedStaging instance;
  return instance;
}

// A sparse result comes back as its entries, O(k P) bytes instead of N floats:
// the device zeroes out[size] and a kernel stores the entries, reading them from
// pinned memory. The caller synchronizes the stream before this thread's next
// call reuses that memory.
ffi::Error sparse_result_to_device(const SparseResult& sparse, int64_t size, float* out,
                                   cudaStream_t stream, const char* op) {
  const size_t entry_bytes = sparse.entries.size() * sizeof(SparseEntry);
  void* device_entries = nullptr;
  if (entry_bytes > 0) {  // none (an empty result): nothing to map, only the zeros
    std::vector<char*> host;
    JSS_RETURN_IF_ERROR(result_staging().carve(op, {entry_bytes}, &host));
    std::memcpy(host[0], sparse.entries.data(), entry_bytes);
    JSS_CUDA_CHECK(cudaHostGetDevicePointer(&device_entries, host[0], 0), op,
                   "cudaHostGetDevicePointer");
  }
  JSS_CUDA_CHECK(write_sparse_result_on_device(static_cast<const SparseEntry*>(device_entries),
                                               static_cast<int64_t>(sparse.entries.size()), size,
                                               out, stream),
                 op, "the result's scatter kernel");
  return ffi::Error::Success();
}

// The stats output is s64, or s32 when JAX runs without x64.
ffi::Error check_stats(const ffi::AnyBuffer& stats, const char* op) {
  if ((stats.element_type() != ffi::S64 && stats.element_type() != ffi::S32) ||
      static_cast<int64_t>(stats.element_count()) != WireStats::kFields) {
    return ffi::Error::InvalidArgument(std::string("jax_sparse_sync.") + op +
                                       ": stats must be s32 or s64 with " +
                                       std::to_string(WireStats::kFields) + " entries");
  }
  return ffi::Error::Success();
}

// Writes the stats into `host` in the output's integer width; returns the bytes.
size_t stats_to_host(const WireStats& stats, const ffi::AnyBuffer& out, void* host) {
  if (out.element_type() == ffi::S64) {
    stats.write(static_cast<int64_t*>(host));
    return WireStats::kFields * sizeof(int64_t);
  }
  stats.write(static_cast<int32_t*>(host));
  return WireStats::kFields * sizeof(int32_t);
}

// Dense and DSAR (dense results): the k-sized input to pinned memory, the CPU
// code on it (prepare_call's checks, the algorithm into N pinned floats), the
// dense result back.
ffi::Error dense_result_on_host(cudaStream_t stream, const ffi::Buffer<ffi::F32>& values,
                                const ffi::Buffer<ffi::S32>& indices,
                                const ffi::Buffer<ffi::S32>& seed, int64_t cap,
                                ffi::ResultBuffer<ffi::F32>& out,
                                ffi::Result<ffi::AnyBuffer>& stats_out, CallConfig config,
                                MPI_Comm comm) {
  static constexpr const char* kOp = "sparse_allreduce";
  const size_t cap_bytes = static_cast<size_t>(cap) * 4;
  const size_t out_bytes = static_cast<size_t>(config.size) * 4;
  std::vector<char*> host;
  JSS_RETURN_IF_ERROR(staging().carve(
      kOp, {cap_bytes, cap_bytes, sizeof(int32_t), out_bytes, WireStats::kFields * sizeof(int64_t)},
      &host));
  JSS_RETURN_IF_ERROR(to_host(host[0], values.typed_data(), cap_bytes, stream, kOp));
  JSS_RETURN_IF_ERROR(to_host(host[1], indices.typed_data(), cap_bytes, stream, kOp));
  JSS_RETURN_IF_ERROR(to_host(host[2], seed.typed_data(), sizeof(int32_t), stream, kOp));
  JSS_RETURN_IF_ERROR(synchronize(stream, kOp));  // MPI must read finished copies
  config.seed = static_cast<uint32_t>(reinterpret_cast<int32_t*>(host[2])[0]);
  PreparedCall call;
  JSS_RETURN_IF_ERROR(prepare_call(reinterpret_cast<float*>(host[0]),
                                   reinterpret_cast<int32_t*>(host[1]), cap, config, comm, &call));
  float* host_out = reinterpret_cast<float*>(host[3]);
  JSS_RETURN_IF_ERROR(run_call(&call, config, comm, host_out));
  const size_t stats_bytes = stats_to_host(call.stats, *stats_out, host[4]);
  JSS_RETURN_IF_ERROR(to_device(out->typed_data(), host_out, out_bytes, stream, kOp));
  JSS_RETURN_IF_ERROR(to_device(stats_out->untyped_data(), host[4], stats_bytes, stream, kOp));
  return synchronize(stream, kOp);  // the staging buffers are reused by the next call
}

// The sparse allreduce: every algorithm but dense and DSAR through the
// device-resident exchange (ffi/collectives/device_exchange.h, its CUDA device in
// device_exchange_cuda.cu: checks, compaction and sums on the device, O(k)
// bytes through pinned memory); dense and DSAR, whose results are dense by
// design, on the host (dense_result_on_host).
ffi::Error SparseAllreduceCudaImpl(cudaStream_t stream, ffi::ScratchAllocator scratch, ffi::Token,
                                   ffi::Buffer<ffi::F32> values, ffi::Buffer<ffi::S32> indices,
                                   ffi::Buffer<ffi::S32> seed, ffi::Result<ffi::Token>,
                                   ffi::ResultBuffer<ffi::F32> out,
                                   ffi::Result<ffi::AnyBuffer> stats_out, int64_t size,
                                   int64_t algorithm, int64_t comm_handle, int64_t nan_policy,
                                   int64_t quantize_bits, int64_t qsgd_bucket, int64_t wire) {
  static constexpr const char* kOp = "sparse_allreduce";
  const int64_t cap = static_cast<int64_t>(values.element_count());
  if (static_cast<int64_t>(indices.element_count()) != cap ||
      static_cast<int64_t>(out->element_count()) != size || seed.element_count() < 1) {
    return ffi::Error::InvalidArgument(
        "jax_sparse_sync.sparse_allreduce: `values`/`indices` lengths or output size mismatch");
  }
  JSS_RETURN_IF_ERROR(check_stats(*stats_out, kOp));
  CallConfig config{size, algorithm, nan_policy, quantize_bits, qsgd_bucket, 0};
  config.wire = wire;
  MPI_Comm comm = comm_from_handle(comm_handle);
  WatchdogScope watchdog("sparse_allreduce", comm);
  if (exchange::runs_on_device(algorithm)) {
    return sparse_allreduce_cuda(stream, scratch, values.typed_data(), indices.typed_data(), cap,
                                 out->typed_data(), stats_out->untyped_data(),
                                 stats_out->element_type() == ffi::S64, config, comm);
  }
  return dense_result_on_host(stream, values, indices, seed, cap, out, stats_out, config, comm);
}

ffi::Error OktopkCudaImpl(cudaStream_t stream, ffi::Token, ffi::Buffer<ffi::F32> values,
                          ffi::Buffer<ffi::S32> indices, ffi::Buffer<ffi::S32> boundaries_in,
                          ffi::Buffer<ffi::F32> threshold_in, ffi::Buffer<ffi::S32> recompute,
                          ffi::Result<ffi::Token>, ffi::ResultBuffer<ffi::F32> out,
                          ffi::ResultBuffer<ffi::U8> contributed,
                          ffi::ResultBuffer<ffi::S32> boundaries_out,
                          ffi::ResultBuffer<ffi::F32> threshold_out,
                          ffi::Result<ffi::AnyBuffer> stats_out, int64_t size, int64_t k,
                          int64_t comm_handle, int64_t nan_policy, int64_t region_min,
                          int64_t region_max, int64_t wire_dtype, int64_t partition) {
  static constexpr const char* kOp = "oktopk_allreduce";
  const int64_t cap = static_cast<int64_t>(values.element_count());
  const int64_t nb = static_cast<int64_t>(boundaries_in.element_count());
  if (static_cast<int64_t>(indices.element_count()) != cap ||
      static_cast<int64_t>(contributed->element_count()) != cap ||
      static_cast<int64_t>(out->element_count()) != size ||
      static_cast<int64_t>(boundaries_out->element_count()) != nb ||
      threshold_in.element_count() < 1 || recompute.element_count() < 2) {
    return ffi::Error::InvalidArgument(
        "jax_sparse_sync.oktopk_allreduce: argument or output shapes do not match");
  }
  JSS_RETURN_IF_ERROR(check_stats(*stats_out, kOp));
  const size_t cap_bytes = static_cast<size_t>(cap) * 4;
  const size_t bounds_bytes = static_cast<size_t>(nb) * 4;
  std::vector<char*> host;
  JSS_RETURN_IF_ERROR(staging().carve(
      kOp,
      {cap_bytes, cap_bytes, bounds_bytes, sizeof(float), 2 * sizeof(int32_t),
       0 /* no dense result on the host */, static_cast<size_t>(cap), bounds_bytes, sizeof(float),
       WireStats::kFields * sizeof(int64_t)},
      &host));
  OktopkHostArgs args;
  args.values = reinterpret_cast<float*>(host[0]);
  args.indices = reinterpret_cast<int32_t*>(host[1]);
  args.cap = cap;
  args.boundaries_in = reinterpret_cast<int32_t*>(host[2]);
  args.num_boundaries = nb;
  set_oktopk_attributes(&args, size, k, nan_policy, region_min, region_max, wire_dtype,
                        partition);
  float* host_threshold_in = reinterpret_cast<float*>(host[3]);
  int32_t* host_recompute = reinterpret_cast<int32_t*>(host[4]);

  JSS_RETURN_IF_ERROR(to_host(host[0], values.typed_data(), cap_bytes, stream, kOp));
  JSS_RETURN_IF_ERROR(to_host(host[1], indices.typed_data(), cap_bytes, stream, kOp));
  JSS_RETURN_IF_ERROR(to_host(host[2], boundaries_in.typed_data(), bounds_bytes, stream, kOp));
  JSS_RETURN_IF_ERROR(to_host(host[3], threshold_in.typed_data(), sizeof(float), stream, kOp));
  JSS_RETURN_IF_ERROR(to_host(host[4], recompute.typed_data(), 2 * sizeof(int32_t), stream, kOp));
  JSS_RETURN_IF_ERROR(synchronize(stream, kOp));
  args.threshold_in = host_threshold_in[0];
  args.recompute_boundaries = host_recompute[0] != 0;
  args.recompute_threshold = host_recompute[1] != 0;

  OktopkHostResults results;
  results.out = nullptr;  // the result comes back as its entries (below), not N floats
  SparseResult sparse;
  results.sparse = &sparse;
  results.contributed = reinterpret_cast<uint8_t*>(host[6]);
  results.boundaries_out = reinterpret_cast<int32_t*>(host[7]);
  results.threshold_out = reinterpret_cast<float*>(host[8]);
  JSS_RETURN_IF_ERROR(oktopk_allreduce_host(args, comm_from_handle(comm_handle), &results));

  const size_t stats_bytes = stats_to_host(results.stats, *stats_out, host[9]);
  JSS_RETURN_IF_ERROR(sparse_result_to_device(sparse, size, out->typed_data(), stream, kOp));
  JSS_RETURN_IF_ERROR(
      to_device(contributed->typed_data(), host[6], static_cast<size_t>(cap), stream, kOp));
  JSS_RETURN_IF_ERROR(to_device(boundaries_out->typed_data(), host[7], bounds_bytes, stream, kOp));
  JSS_RETURN_IF_ERROR(to_device(threshold_out->typed_data(), host[8], sizeof(float), stream, kOp));
  JSS_RETURN_IF_ERROR(to_device(stats_out->untyped_data(), host[9], stats_bytes, stream, kOp));
  return synchronize(stream, kOp);
}

// The handlers on a dense float32 vector (the block-sparse and the dense
// allreduce): x comes to the host whole, run(host_x, host_out, n, &stats) computes
// the result there with the CPU code (host_out is host_x itself with in_place:
// one pinned buffer), and the result and the statistics go back.
template <typename Run>
ffi::Error dense_on_host(cudaStream_t stream, const char* op, const ffi::Buffer<ffi::F32>& x,
                         ffi::ResultBuffer<ffi::F32>& out, ffi::Result<ffi::AnyBuffer>& stats_out,
                         bool in_place, Run&& run) {
  const int64_t n = static_cast<int64_t>(x.element_count());
  if (static_cast<int64_t>(out->element_count()) != n) {
    return ffi::Error::InvalidArgument(std::string("jax_sparse_sync.") + op +
                                       ": output size does not match the input");
  }
  JSS_RETURN_IF_ERROR(check_stats(*stats_out, op));
  const size_t bytes = static_cast<size_t>(n) * 4;
  const size_t stats_max = WireStats::kFields * sizeof(int64_t);
  std::vector<char*> host;
  if (in_place) {
    JSS_RETURN_IF_ERROR(staging().carve(op, {bytes, stats_max}, &host));
  } else {
    JSS_RETURN_IF_ERROR(staging().carve(op, {bytes, bytes, stats_max}, &host));
  }
  float* host_x = reinterpret_cast<float*>(host[0]);
  float* host_out = in_place ? host_x : reinterpret_cast<float*>(host[1]);
  char* host_stats = host.back();
  JSS_RETURN_IF_ERROR(to_host(host_x, x.typed_data(), bytes, stream, op));
  JSS_RETURN_IF_ERROR(synchronize(stream, op));
  WireStats stats;
  JSS_RETURN_IF_ERROR(run(host_x, host_out, n, &stats));
  const size_t stats_bytes = stats_to_host(stats, *stats_out, host_stats);
  JSS_RETURN_IF_ERROR(to_device(out->typed_data(), host_out, bytes, stream, op));
  JSS_RETURN_IF_ERROR(to_device(stats_out->untyped_data(), host_stats, stats_bytes, stream, op));
  return synchronize(stream, op);
}

// The input is the dense gradient itself (which blocks are nonzero is found on
// the host, by the same code as on CPU), so all of it comes over.
ffi::Error BlockAllreduceCudaImpl(cudaStream_t stream, ffi::Token, ffi::Buffer<ffi::F32> x,
                                  ffi::Result<ffi::Token>, ffi::ResultBuffer<ffi::F32> out,
                                  ffi::Result<ffi::AnyBuffer> stats_out, int64_t block,
                                  int64_t comm_handle, int64_t nan_policy) {
  return dense_on_host(stream, "block_allreduce", x, out, stats_out, /*in_place=*/false,
                       [&](float* host_x, float* host_out, int64_t n, WireStats* stats) {
                         return block_allreduce_host(host_x, n, block,
                                                     comm_from_handle(comm_handle), nan_policy,
                                                     host_out, stats);
                       });
}

// The dense allreduce: the whole vector comes to the host (one pinned buffer),
// is summed there in place with the CPU code, and goes back over the output
// (which XLA aliases to the input, so no device buffer is allocated).
ffi::Error DenseAllreduceCudaImpl(cudaStream_t stream, ffi::Token, ffi::Buffer<ffi::F32> x,
                                  ffi::Result<ffi::Token>, ffi::ResultBuffer<ffi::F32> out,
                                  ffi::Result<ffi::AnyBuffer> stats_out, int64_t comm_handle,
                                  int64_t nan_policy, int64_t wire_dtype) {
  return dense_on_host(stream, "dense_allreduce", x, out, stats_out, /*in_place=*/true,
                       [&](float* host_x, float* host_out, int64_t n, WireStats* stats) {
                         MPI_Comm comm = comm_from_handle(comm_handle);
                         WatchdogScope watchdog("dense_allreduce", comm);
                         return dense_allreduce_host(host_x, host_out, n, comm, nan_policy,
                                                     wire_dtype, stats);
                       });
}

// The byte allgather of chunked_topk_sync: the payload (B bytes) and its flag come
// to the host, the CPU code gathers the P payloads into a pinned buffer, and they
// go back into the (P, B) output.
ffi::Error AllgatherBytesCudaImpl(cudaStream_t stream, ffi::Token, ffi::Buffer<ffi::U8> payload,
                                  ffi::Buffer<ffi::S32> non_finite, ffi::Result<ffi::Token>,
                                  ffi::ResultBuffer<ffi::U8> out,
                                  ffi::Result<ffi::AnyBuffer> stats_out, int64_t comm_handle,
                                  int64_t nan_policy, int64_t param) {
  static constexpr const char* kOp = "allgather_bytes";
  const size_t bytes = payload.element_count();
  const size_t gathered = out->element_count();
  if (non_finite.element_count() != 1 || (bytes == 0 ? gathered != 0 : gathered % bytes != 0)) {
    return ffi::Error::InvalidArgument(
        "jax_sparse_sync.allgather_bytes: the output must hold P payloads and `non_finite` "
        "one int32");
  }
  JSS_RETURN_IF_ERROR(check_stats(*stats_out, kOp));
  std::vector<char*> host;
  JSS_RETURN_IF_ERROR(staging().carve(
      kOp, {bytes, gathered, sizeof(int32_t), WireStats::kFields * sizeof(int64_t)}, &host));
  JSS_RETURN_IF_ERROR(to_host(host[0], payload.untyped_data(), bytes, stream, kOp));
  JSS_RETURN_IF_ERROR(to_host(host[2], non_finite.untyped_data(), sizeof(int32_t), stream, kOp));
  JSS_RETURN_IF_ERROR(synchronize(stream, kOp));
  int32_t flag = 0;
  std::memcpy(&flag, host[2], sizeof(flag));
  MPI_Comm comm = comm_from_handle(comm_handle);
  WatchdogScope watchdog(kOp, comm);
  WireStats stats;
  JSS_RETURN_IF_ERROR(allgather_bytes_host(reinterpret_cast<const uint8_t*>(host[0]),
                                           static_cast<int64_t>(bytes), flag != 0, param, comm,
                                           nan_policy, reinterpret_cast<uint8_t*>(host[1]),
                                           &stats));
  const size_t stats_bytes = stats_to_host(stats, *stats_out, host[3]);
  JSS_RETURN_IF_ERROR(to_device(out->untyped_data(), host[1], gathered, stream, kOp));
  JSS_RETURN_IF_ERROR(to_device(stats_out->untyped_data(), host[3], stats_bytes, stream, kOp));
  return synchronize(stream, kOp);
}

// Non-blocking pair: start copies the k-sized inputs to the host and hands them
// to the same worker-thread machinery as on CPU (which copies them again, so
// the staging buffers are free on return); done waits and copies the result
// back. The handle is an int32 on the device, like on CPU.
ffi::Error SparseAllreduceStartCudaImpl(cudaStream_t stream, ffi::Token,
                                        ffi::Buffer<ffi::F32> values,
                                        ffi::Buffer<ffi::S32> indices, ffi::Buffer<ffi::S32> seed,
                                        ffi::Result<ffi::Token>,
                                        ffi::ResultBuffer<ffi::S32> handle_out, int64_t size,
                                        int64_t algorithm, int64_t comm_handle,
                                        int64_t nan_policy, int64_t quantize_bits,
                                        int64_t qsgd_bucket, int64_t wire, int64_t flags) {
  static constexpr const char* kOp = "sparse_allreduce_start";
  const int64_t cap = static_cast<int64_t>(values.element_count());
  if (static_cast<int64_t>(indices.element_count()) != cap || seed.element_count() < 1) {
    return ffi::Error::InvalidArgument(
        "jax_sparse_sync.sparse_allreduce_start: `values` and `indices` lengths differ");
  }
  const size_t cap_bytes = static_cast<size_t>(cap) * 4;
  std::vector<char*> host;
  JSS_RETURN_IF_ERROR(
      staging().carve(kOp, {cap_bytes, cap_bytes, sizeof(int32_t), sizeof(int32_t)}, &host));
  JSS_RETURN_IF_ERROR(to_host(host[0], values.typed_data(), cap_bytes, stream, kOp));
  JSS_RETURN_IF_ERROR(to_host(host[1], indices.typed_data(), cap_bytes, stream, kOp));
  JSS_RETURN_IF_ERROR(to_host(host[2], seed.typed_data(), sizeof(int32_t), stream, kOp));
  JSS_RETURN_IF_ERROR(synchronize(stream, kOp));
  CallConfig config{size, algorithm, nan_policy, quantize_bits, qsgd_bucket,
                    static_cast<uint32_t>(reinterpret_cast<int32_t*>(host[2])[0])};
  config.wire = wire;
  int32_t* host_handle = reinterpret_cast<int32_t*>(host[3]);
  JSS_RETURN_IF_ERROR(start_allreduce_host(reinterpret_cast<float*>(host[0]),
                                           reinterpret_cast<int32_t*>(host[1]), cap, config,
                                           comm_handle, flags, host_handle));
  JSS_RETURN_IF_ERROR(
      to_device(handle_out->typed_data(), host_handle, sizeof(int32_t), stream, kOp));
  return synchronize(stream, kOp);
}

ffi::Error SparseAllreduceDoneCudaImpl(cudaStream_t stream, ffi::Token,
                                       ffi::Buffer<ffi::S32> handle, ffi::Result<ffi::Token>,
                                       ffi::ResultBuffer<ffi::F32> out,
                                       ffi::Result<ffi::AnyBuffer> stats_out) {
  static constexpr const char* kOp = "sparse_allreduce_done";
  JSS_RETURN_IF_ERROR(check_stats(*stats_out, kOp));
  const int64_t size = static_cast<int64_t>(out->element_count());
  std::vector<char*> host;
  JSS_RETURN_IF_ERROR(staging().carve(
      kOp, {sizeof(int32_t), static_cast<size_t>(size) * 4, WireStats::kFields * sizeof(int64_t)},
      &host));
  int32_t* host_handle = reinterpret_cast<int32_t*>(host[0]);
  JSS_RETURN_IF_ERROR(to_host(host_handle, handle.typed_data(), sizeof(int32_t), stream, kOp));
  JSS_RETURN_IF_ERROR(synchronize(stream, kOp));
  WireStats stats;
  JSS_RETURN_IF_ERROR(
      finish_allreduce_host(host_handle[0], size, reinterpret_cast<float*>(host[1]), &stats));
  const size_t stats_bytes = stats_to_host(stats, *stats_out, host[2]);
  JSS_RETURN_IF_ERROR(
      to_device(out->typed_data(), host[1], static_cast<size_t>(size) * 4, stream, kOp));
  JSS_RETURN_IF_ERROR(to_device(stats_out->untyped_data(), host[2], stats_bytes, stream, kOp));
  return synchronize(stream, kOp);
}

}  // namespace
}  // namespace jss

// No traits: these handlers synchronize the stream, so they must not be
// captured into a CUDA graph (command buffer).
XLA_FFI_DEFINE_HANDLER_SYMBOL(JssSparseAllreduceCuda, jss::SparseAllreduceCudaImpl,
                              jss::sig::bind_sparse_allreduce(ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Ctx<ffi::ScratchAllocator>()));

XLA_FFI_DEFINE_HANDLER_SYMBOL(JssOktopkAllreduceCuda, jss::OktopkCudaImpl,
                              jss::sig::bind_oktopk_allreduce(ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()));

XLA_FFI_DEFINE_HANDLER_SYMBOL(JssBlockAllreduceCuda, jss::BlockAllreduceCudaImpl,
                              jss::sig::bind_block_allreduce(ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()));

XLA_FFI_DEFINE_HANDLER_SYMBOL(JssDenseAllreduceCuda, jss::DenseAllreduceCudaImpl,
                              jss::sig::bind_dense_allreduce(ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()));

XLA_FFI_DEFINE_HANDLER_SYMBOL(JssSparseAllreduceStartCuda, jss::SparseAllreduceStartCudaImpl,
                              jss::sig::bind_sparse_allreduce_start(ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()));

XLA_FFI_DEFINE_HANDLER_SYMBOL(JssSparseAllreduceDoneCuda, jss::SparseAllreduceDoneCudaImpl,
                              jss::sig::bind_sparse_allreduce_done(ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()));

XLA_FFI_DEFINE_HANDLER_SYMBOL(JssAllgatherBytesCuda, jss::AllgatherBytesCudaImpl,
                              jss::sig::bind_allgather_bytes(ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()));
