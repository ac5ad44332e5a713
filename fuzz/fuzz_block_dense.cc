// Fuzz target: one rank of the dense-input collectives, block-sparse
// (ffi/collectives/block_allreduce.cc's block_allreduce_host) and the dense allreduce with
// its float32 / bfloat16 / float16 wires (ffi/collectives/dense_and_allgather.cc's
// dense_allreduce_host), while the other ranks are the fuzzer
// (fuzz/fake_mpi.h). Errors are fine; out-of-bounds accesses (ASan) and
// undefined behavior (UBSan) are findings.
#include <cstdint>
#include <vector>

#include "ffi/collectives/collectives_host.h"
#include "fuzz/fake_mpi.h"
#include "fuzz/fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::Input in(data, size);
  const int nranks = static_cast<int>(in.in_range(1, 8));
  const int rank = static_cast<int>(in.in_range(0, nranks - 1));
  const uint8_t which = in.take<uint8_t>();
  const int64_t n = in.in_range(1, 300);
  const int64_t nan_policy = in.in_range(0, 1);
  const int64_t param = in.in_range(0, 40);  // block size, or the wire dtype (0-2 valid)
  std::vector<float> x(static_cast<size_t>(n));
  // Mostly zeros, so that blocks are sparse.
  for (auto& v : x) v = (in.take<uint8_t>() & 3) == 0 ? in.value() : 0.0f;
  fake_mpi::reset(rank, nranks, in.rest(), in.rest_size());

  std::vector<float> out(static_cast<size_t>(n), -1.0f);
  jss::WireStats stats;
  if (which & 1) {
    (void)jss::block_allreduce_host(x.data(), n, param, MPI_COMM_WORLD, nan_policy, out.data(),
                                    &stats);
  } else {
    // In place (out == in) as the CUDA path calls it, or into a separate buffer.
    float* dst = (which & 2) ? x.data() : out.data();
    (void)jss::dense_allreduce_host(x.data(), dst, n, MPI_COMM_WORLD, nan_policy, param % 4,
                                    &stats);
  }
  fake_mpi::expect_no_request_pending();
  return 0;
}
