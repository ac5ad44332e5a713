// The sparse reduce-scatter of jss.sharded_sync (issue 58): each rank's sparse
// entries summed at the owner of their region, and nothing gathered after it.
//
// Rank q owns the fixed region [q N / P, (q + 1) N / P) (split-allgather's
// ranges, balanced by size and the same every step, so the optimizer state of a
// region never moves). This is split-allgather's phase 1 on its own
// (exchange_slices: the slice sizes, then one message per owner with entries,
// in rotated order); the owner merges the P slices of its region in rank order
// 0, 1, ..., P-1, so its sum has the bits split-allgather's owner would hold.
// Then one allgather of the owners' merged counts (8 bytes to each peer): every
// rank learns that an owner received a malformed message (a corrupt peer), so
// all ranks fail together instead of one failing and its peers waiting for it
// in the next call, and the union's size (result_nnz, the entries summed).
//
// Output: this rank's region sum, dense, padded to ceil(N / P) floats (every
// rank's buffer has the same shape: the same compiled program on every rank);
// the slots past the region's end are zero.
#include <mpi.h>

#include <algorithm>
#include <string>
#include <vector>

#include "ffi/collectives/algorithms.h"
#include "ffi/collectives/allreduce_call.h"
#include "ffi/collectives/peer_checks.h"
#include "ffi/collectives/region_reduce.h"
#include "ffi/collectives/sparse_allreduce.h"
#include "ffi/runtime/mpi_comm.h"
#include "ffi/runtime/watchdog.h"
#include "kernels/sparse_stream.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace jss {

ffi::Error region_reduce_host(const float* values, const int32_t* indices, int64_t cap,
                              int64_t size, MPI_Comm comm, int64_t nan_policy, float* dst,
                              WireStats* out_stats) {
  CallConfig config;
  config.size = size;
  config.algorithm = static_cast<int64_t>(Algorithm::kRegionReduce);
  config.nan_policy = nan_policy;
  PreparedCall call;  // the header allgather: sizes, the op and the indices checked on all ranks
  if (auto e = prepare_call(values, indices, cap, config, comm, &call); e.failure()) return e;
  const int rank = call.rank, P = call.nranks;
  WireStats* stats = &call.stats;
  std::vector<int64_t> bounds(P + 1);
  for (int q = 0; q <= P; ++q) bounds[q] = size * q / P;
  const int64_t lo = bounds[rank], hi = bounds[rank + 1];
  const std::vector<SparseEntry>& local = call.local.entries;
  const std::vector<int64_t> slice_begin = slice_offsets(local, bounds);
  std::vector<std::vector<SparseEntry>> received(P);
  ffi::Error malformed = ffi::Error::Success();
  if (auto e = exchange_slices(local, slice_begin, size, WireFormat{}, comm, rank, P,
                               "MPI_Waitall (slice sizes)", "region reduce", stats, &received,
                               &malformed);
      e.failure()) {
    return e;
  }
  for (int q = 0; q < P; ++q) {  // a slice outside this region would be written past it
    if (q == rank || malformed.failure()) continue;
    if (auto e = check_peer_entries(received[q].data(),
                                    static_cast<int64_t>(received[q].size()), lo, hi, rank, q,
                                    "slice (region reduce)");
        e.failure()) {
      received[q].clear();
      malformed = std::move(e);
    }
  }
  received[rank].assign(local.begin() + slice_begin[rank], local.begin() + slice_begin[rank + 1]);
  std::vector<SparseEntry> mine, scratch;
  for (int q = 0; q < P; ++q) {  // rank order: split-allgather's owner sum
    merge_sparse(mine, received[q], &scratch);
    mine.swap(scratch);
  }
  std::vector<int64_t> merged(P, 0);
  const int64_t my_count = malformed.failure() ? kMalformedBlock
                                               : static_cast<int64_t>(mine.size());
  if (auto e = allgather_lengths(my_count, merged.data(), comm, rank, P,
                                 "MPI_Allgather (merged counts)", stats);
      e.failure()) {
    return e;
  }
  if (malformed.failure()) return malformed;  // after the allgather: no one waits for us
  int64_t total = 0;
  for (int q = 0; q < P; ++q) {
    if (merged[q] == kMalformedBlock) return malformed_phase1(rank, q);
    if (auto e = check_peer_count(merged[q], bounds[q + 1] - bounds[q], rank, q,
                                  "merged count (region reduce)");
        e.failure()) {
      return e;
    }
    total += merged[q];
  }
  std::fill(dst, dst + (size + P - 1) / P, 0.0f);
  for (const SparseEntry& e : mine) dst[e.index - lo] = e.value;
  stats->result_nnz = total;
  stats->switched_to_dense = 0;
  stats->algorithm = config.algorithm;
  *out_stats = *stats;
  return ffi::Error::Success();
}

namespace {

ffi::Error RegionReduceImpl(ffi::Token, ffi::Buffer<ffi::F32> values,
                            ffi::Buffer<ffi::S32> indices, ffi::Result<ffi::Token>,
                            ffi::ResultBuffer<ffi::F32> out, ffi::Result<ffi::AnyBuffer> stats_out,
                            int64_t size, int64_t comm_handle, int64_t nan_policy) {
  const int64_t cap = static_cast<int64_t>(values.element_count());
  MPI_Comm comm = comm_from_handle(comm_handle);
  int nranks = 1;
  JSS_MPI_CHECK(MPI_Comm_size(comm, &nranks), "MPI_Comm_size", -1);
  const int64_t slot = (size + nranks - 1) / nranks;
  // Shapes come from the same traced program on every rank: a mismatch is the
  // caller's bug on all of them at once (no rank is left in a collective).
  if (static_cast<int64_t>(indices.element_count()) != cap ||
      static_cast<int64_t>(out->element_count()) != slot) {
    return ffi::Error::InvalidArgument(
        "jax_sparse_sync.region_reduce: `values`/`indices` lengths differ or the output is not "
        "ceil(size / P) = " + std::to_string(slot) + " floats");
  }
  WatchdogScope watchdog("region_reduce", comm);
  WireStats stats;
  if (auto e = region_reduce_host(values.typed_data(), indices.typed_data(), cap, size, comm,
                                  nan_policy, out->typed_data(), &stats);
      e.failure()) {
    return e;
  }
  return write_stats(stats, stats_out);
}

}  // namespace
}  // namespace jss

XLA_FFI_DEFINE_HANDLER_SYMBOL(JssRegionReduce, jss::RegionReduceImpl,
                              jss::sig::bind_region_reduce(ffi::Ffi::Bind()));
