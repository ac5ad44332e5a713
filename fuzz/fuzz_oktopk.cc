// Fuzz target: one rank of Ok-Topk (ffi/collectives/oktopk.cc's oktopk_allreduce_host:
// argument check, boundary agreement (or hash owners), split-and-reduce, the distributed
// threshold, the balancing step and the final allgatherv) while the other
// ranks are the fuzzer (fuzz/fake_mpi.h). Errors are fine; out-of-bounds
// accesses (ASan) and undefined behavior (UBSan) are findings.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "ffi/collectives/collectives_host.h"
#include "fuzz/fake_mpi.h"
#include "fuzz/fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::Input in(data, size);
  const int nranks = static_cast<int>(in.in_range(1, 8));
  const int rank = static_cast<int>(in.in_range(0, nranks - 1));
  jss::OktopkHostArgs args;
  args.size = in.in_range(1, 300);
  args.k = in.in_range(0, args.size);
  args.nan_policy = in.in_range(0, 1);
  const uint8_t flags = in.take<uint8_t>();
  args.recompute_boundaries = flags & 1;
  args.recompute_threshold = flags & 2;
  args.region_min = (flags & 4) ? in.in_range(0, args.size) : 0;
  args.region_max = (flags & 8) ? in.in_range(0, args.size) : INT64_MAX;
  args.partition = (flags & 64) ? 1 : 0;  // hash owners
  args.threshold_in = in.value();
  // Boundaries: usually P + 1 sorted entries from 0 to size, sometimes anything.
  const int64_t num_boundaries = (flags & 16) ? in.in_range(0, 10) : nranks + 1;
  std::vector<int32_t> boundaries(static_cast<size_t>(num_boundaries));
  for (int64_t q = 0; q < num_boundaries; ++q) {
    boundaries[q] = (flags & 32) ? in.take<int32_t>()
                                 : static_cast<int32_t>(args.size * q / std::max<int64_t>(num_boundaries - 1, 1));
  }
  args.cap = in.in_range(0, 64);
  std::vector<float> values(static_cast<size_t>(args.cap));
  std::vector<int32_t> indices(static_cast<size_t>(args.cap));
  for (int64_t i = 0; i < args.cap; ++i) {
    indices[i] = in.index(args.size);
    values[i] = in.value();
  }
  args.values = values.data();
  args.indices = indices.data();
  args.boundaries_in = boundaries.data();
  args.num_boundaries = num_boundaries;
  fake_mpi::reset(rank, nranks, in.rest(), in.rest_size());

  std::vector<float> out(static_cast<size_t>(args.size));
  std::vector<uint8_t> contributed(static_cast<size_t>(args.cap));
  std::vector<int32_t> boundaries_out(static_cast<size_t>(nranks + 1));
  float threshold_out = 0.0f;
  jss::OktopkHostResults results;
  results.out = out.data();
  results.contributed = contributed.data();
  results.boundaries_out = boundaries_out.data();
  results.threshold_out = &threshold_out;
  (void)jss::oktopk_allreduce_host(args, MPI_COMM_WORLD, &results);
  fake_mpi::expect_no_request_pending();
  return 0;
}
