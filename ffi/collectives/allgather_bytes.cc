// jss_allgather_bytes: the allgather of one fixed-size byte payload per rank
// (see allgather_bytes.h). The payload's format is the caller's; this file
// only checks that the ranks agree on its length and moves it.
#include "ffi/collectives/allgather_bytes.h"

#include <mpi.h>

#include <cstring>
#include <vector>

#include "ffi/collectives/algorithms.h"
#include "ffi/collectives/allreduce_call.h"
#include "ffi/collectives/sparse_allreduce.h"
#include "ffi/runtime/blocked_on.h"
#include "ffi/runtime/watchdog.h"

namespace ffi = xla::ffi;

namespace jss {

ffi::Error allgather_bytes_host(const uint8_t* in, int64_t bytes, bool non_finite, int64_t param,
                                MPI_Comm comm, int64_t nan_policy, uint8_t* out,
                                WireStats* stats) {
  BlockedLabel label("allgather_bytes");
  int rank = 0, nranks = 1;
  JSS_MPI_CHECK(MPI_Comm_rank(comm, &rank), "MPI_Comm_rank", -1);
  JSS_MPI_CHECK(MPI_Comm_size(comm, &nranks), "MPI_Comm_size", rank);
  CallHeader header;
  header.size = bytes;  // the payload's length: the same on every rank
  header.nnz = bytes;
  header.algorithm = static_cast<int64_t>(Algorithm::kAllgather);
  header.param = param;
  if (non_finite) header.flags |= CallHeader::kNonFinite;
  std::vector<CallHeader> headers;
  if (auto e = exchange_headers(header, comm, rank, nranks, static_cast<NanPolicy>(nan_policy),
                                "allgather_bytes", &headers, stats);
      e.failure()) {
    return e;
  }
  if (nranks > 1 && bytes > 0) {
    // every block has the same length: allgather_blocks takes MPI_Allgather
    std::vector<MPI_Count> counts(nranks, static_cast<MPI_Count>(bytes));
    std::vector<MPI_Aint> displs(nranks);
    for (int r = 0; r < nranks; ++r) displs[r] = static_cast<MPI_Aint>(r) * bytes;
    if (auto e = allgather_blocks(in, out, counts, displs, MPI_BYTE, comm, rank,
                                  "MPI_Allgather (allgather_bytes)");
        e.failure()) {
      return e;
    }
    stats->bytes_sent += bytes * (nranks - 1);
    stats->bytes_received += bytes * (nranks - 1);
    stats->messages += ceil_log2(nranks);
  } else if (bytes > 0) {
    std::memcpy(out, in, static_cast<size_t>(bytes));
  }
  stats->algorithm = static_cast<int64_t>(Algorithm::kAllgather);
  return ffi::Error::Success();
}

namespace {

ffi::Error AllgatherBytesImpl(ffi::Token, ffi::Buffer<ffi::U8> payload,
                              ffi::Buffer<ffi::S32> non_finite, ffi::Result<ffi::Token>,
                              ffi::ResultBuffer<ffi::U8> out,
                              ffi::Result<ffi::AnyBuffer> stats_out, int64_t comm_handle,
                              int64_t nan_policy, int64_t param) {
  const int64_t bytes = static_cast<int64_t>(payload.element_count());
  MPI_Comm comm = comm_from_handle(comm_handle);
  int nranks = 1;
  JSS_MPI_CHECK(MPI_Comm_size(comm, &nranks), "MPI_Comm_size", -1);
  if (static_cast<int64_t>(out->element_count()) != bytes * nranks ||
      non_finite.element_count() != 1) {
    return ffi::Error::InvalidArgument(
        "jax_sparse_sync.allgather_bytes: the output must hold P payloads and `non_finite` "
        "one int32 (the primitive's abstract evaluation disagrees with the communicator)");
  }
  WireStats stats;
  WatchdogScope watchdog("allgather_bytes", comm);
  if (auto e = allgather_bytes_host(payload.typed_data(), bytes, non_finite.typed_data()[0] != 0,
                                    param, comm, nan_policy, out->typed_data(), &stats);
      e.failure()) {
    return e;
  }
  return write_stats(stats, stats_out);
}

}  // namespace
}  // namespace jss

XLA_FFI_DEFINE_HANDLER_SYMBOL(JssAllgatherBytes, jss::AllgatherBytesImpl,
                              jss::sig::bind_allgather_bytes(xla::ffi::Ffi::Bind()));
