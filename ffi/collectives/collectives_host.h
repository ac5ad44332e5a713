// Host-pointer entry points of the MPI collectives that have their own FFI
// handlers (Ok-Topk, block-sparse, non-blocking). The CPU handlers wrap them directly; the
// CUDA handlers (ffi/cuda/mpi_cuda.cc) stage device data through pinned host
// buffers and call the same functions. The sparse allreduce has its own pair
// in allreduce_call.h (prepare_call/run_call).
#pragma once

#include <mpi.h>

#include <cstdint>
#include <vector>

#include "ffi/collectives/algorithms.h"
#include "ffi/collectives/allreduce_call.h"
#include "ffi/runtime/mpi_comm.h"
#include "xla/ffi/api/ffi.h"

namespace jss {

// Ok-Topk: writes the dense global top-k sum (out[size]), which input slots
// made it (contributed[cap]), the region boundaries used (boundaries_out[P+1])
// and the threshold used. `boundaries_in` holds num_boundaries entries, which
// must be P + 1 (checked after the collective argument check, so every rank
// fails together).
struct OktopkHostArgs {
  const float* values = nullptr;
  const int32_t* indices = nullptr;
  int64_t cap = 0;
  const int32_t* boundaries_in = nullptr;
  int64_t num_boundaries = 0;
  float threshold_in = 0.0f;
  bool recompute_boundaries = false;
  bool recompute_threshold = false;
  int64_t size = 0;
  int64_t k = 0;
  int64_t nan_policy = 0;
  // Each owner keeps at least min(region_min, nonzero entries) and at most
  // region_max entries of its reduced region (its exact top ones when the
  // threshold picks fewer or more); 0 and INT64_MAX: the threshold alone.
  int64_t region_min = 0;
  int64_t region_max = INT64_MAX;
  // The values' wire dtype (0 float32, 1 bfloat16, 2 float16; ffi/collectives/wire_codec.h):
  // each rank rounds its entries before they travel and keeps the rounded ones
  // for its own region; owners sum in float32 and round what they select.
  int64_t wire_dtype = 0;
  // Who owns an index: 0 contiguous regions (the boundaries), 1 the hash owner
  // hash_owner(index, P) (ffi/collectives/algorithms.h; the boundaries pass through unused).
  int64_t partition = 0;
};

// The attributes both Ok-Topk handlers (CPU: oktopk.cc, CUDA: ffi/cuda/mpi_cuda.cc)
// pass on as they come.
inline void set_oktopk_attributes(OktopkHostArgs* args, int64_t size, int64_t k,
                                  int64_t nan_policy, int64_t region_min, int64_t region_max,
                                  int64_t wire_dtype, int64_t partition) {
  args->size = size;
  args->k = k;
  args->nan_policy = nan_policy;
  args->region_min = region_min;
  args->region_max = region_max;
  args->wire_dtype = wire_dtype;
  args->partition = partition;
}

struct OktopkHostResults {
  float* out = nullptr;              // [size]; not written when `sparse` takes the result
  // Optional: where the result goes as its entries (sorted, unique) instead of
  // `out`, so that the CUDA handler brings back O(k) entries, not N floats.
  SparseResult* sparse = nullptr;
  uint8_t* contributed = nullptr;    // [cap]
  int32_t* boundaries_out = nullptr; // [P + 1]
  float* threshold_out = nullptr;    // scalar
  WireStats stats;
};

xla::ffi::Error oktopk_allreduce_host(const OktopkHostArgs& args, MPI_Comm comm,
                                      OktopkHostResults* results);

// Block-sparse allreduce of the dense x[n] into out[n], blocks of `block`.
xla::ffi::Error block_allreduce_host(const float* x, int64_t n, int64_t block, MPI_Comm comm,
                                     int64_t nan_policy, float* out, WireStats* stats);

// Dense allreduce of in[n] into out[n] (out == in: in place), after the
// argument check (sizes and wire_dtype agree; non-finite input under
// nan_policy "raise"). wire_dtype 0: MPI_Allreduce of the float32 vector;
// 1 / 2: a bfloat16 / float16 wire, summed in float32 (dense_and_allgather.cc).
xla::ffi::Error dense_allreduce_host(const float* in, float* out, int64_t n, MPI_Comm comm,
                                     int64_t nan_policy, int64_t wire_dtype, WireStats* stats);

// Non-blocking sparse allreduce (nonblocking_ffi.cc). start: the collective
// argument check on the calling thread, then the algorithm on a worker thread
// (the inputs are copied first, so they may be freed on return); writes the
// operation's handle. finish: waits for that operation and writes the dense
// result out[size] and its statistics.
// `flags`: kStartWaitPrevious, kStartDeferCheck and a window w in bits 8-15
// (see nonblocking_ffi.cc).
constexpr int64_t kStartWaitPrevious = 1;
constexpr int64_t kStartDeferCheck = 2;
// Operation number s runs on slot s mod kNonblockingSlots, each slot owning a
// duplicate of the user's communicator (exposed to Python as NONBLOCKING_SLOTS).
constexpr int kNonblockingSlots = 8;
constexpr int kStartWindowShift = 8;
constexpr int64_t kStartWindowMask = 0xff;
xla::ffi::Error start_allreduce_host(const float* values, const int32_t* indices, int64_t cap,
                                     const CallConfig& config, int64_t comm_handle, int64_t flags,
                                     int32_t* handle_out);
xla::ffi::Error finish_allreduce_host(int32_t handle, int64_t size, float* out, WireStats* stats);

// When each finished non-blocking operation of this process was started, had
// its arguments checked, was on the wire and was waited for (CLOCK_MONOTONIC
// nanoseconds), so a benchmark can draw a step's timeline. The last 65536
// operations are kept; `clear` empties the record.
struct TimelineRecord {
  int64_t op = 0;             // operation number in this process (start order)
  int64_t size = 0;           // dense length of the result
  int64_t bytes_sent = 0;
  int64_t start_ns = 0;       // start called
  int64_t checked_ns = 0;     // argument check done (the worker is launched)
  int64_t wire_begin_ns = 0;  // the worker began the algorithm
  int64_t wire_end_ns = 0;    // the algorithm returned
  int64_t done_ns = 0;        // done called
  int64_t done_exit_ns = 0;   // done returned
};
std::vector<TimelineRecord> nonblocking_timeline(bool clear);

}  // namespace jss
