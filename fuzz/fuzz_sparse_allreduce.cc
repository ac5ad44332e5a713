// Fuzz target: one rank of the MPI sparse allreduce (ffi/collectives/sparse_allreduce_ffi.cc's
// prepare_call + run_call: the collective argument check, then dense,
// allgather, recursive_doubling, split_allgather, dsar_split_allgather (QSGD
// included) or hash_partition) while the other ranks are the fuzzer
// (fuzz/fake_mpi.h): they may send corrupted headers, counts, indices and
// values, truncated or overlong messages. The rank must return an error or a
// result; it must never read or write out of bounds (ASan) or hit undefined
// behavior (UBSan). Bit 7 of the variant byte runs the same call through the
// device-resident exchange's protocol on its host Device.
#include <cstdint>
#include <vector>

#include "ffi/collectives/algorithms.h"
#include "ffi/collectives/allreduce_call.h"
#include "ffi/collectives/device_exchange.h"
#include "ffi/collectives/device_exchange_host.h"
#include "ffi/collectives/sparse_allreduce.h"
#include "fuzz/fake_mpi.h"
#include "fuzz/fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::Input in(data, size);
  static constexpr int64_t kAlgorithms[] = {0, 1, 2, 3, 4, 7};
  const int nranks = static_cast<int>(in.in_range(1, 8));
  const int rank = static_cast<int>(in.in_range(0, nranks - 1));
  jss::CallConfig config;
  config.size = in.in_range(1, 300);
  config.algorithm = kAlgorithms[in.in_range(0, 5)];
  config.nan_policy = in.in_range(0, 1);
  const uint8_t variant = in.take<uint8_t>();
  if (config.algorithm == 4 && (variant & 3) != 0) {
    static constexpr int64_t kBits[] = {0, 2, 4, 8};
    config.quantize_bits = kBits[variant & 3];
    config.qsgd_bucket = in.in_range(1, 64);
  }
  config.seed = in.take<uint32_t>();
  // bits 4-6: the wire format (value dtype, index encoding; ffi/collectives/wire_codec.h), so the
  // peers' bytes are also parsed as 16-bit values and encoded index messages
  const int wire_bits = variant >> 4;
  config.wire = jss::WireFormat{wire_bits % 3, (wire_bits >> 2) & 1}.word();
  const bool sparse_result = variant & 4;
  // dense_sync's identity input (slot i holds index i) takes the dense path.
  const bool identity = (variant & 8) && config.size <= 64;
  const int64_t cap = identity ? config.size : in.in_range(0, 64);
  std::vector<float> values(static_cast<size_t>(cap));
  std::vector<int32_t> indices(static_cast<size_t>(cap));
  for (int64_t i = 0; i < cap; ++i) {
    indices[i] = identity ? static_cast<int32_t>(i) : in.index(config.size);
    values[i] = in.value();
  }
  fake_mpi::reset(rank, nranks, in.rest(), in.rest_size());

  // bit 7: the device-resident exchange (ffi/collectives/device_exchange.h) through the
  // CPU seam's host Device: the peers' counts and runs checked on the "device", the
  // host algorithms called without a host output of N floats.
  if ((variant & 0x80) && jss::exchange::runs_on_device(config.algorithm)) {
    std::vector<float> out(static_cast<size_t>(config.size), -1.0f);
    int64_t stats[jss::WireStats::kFields] = {};
    jss::exchange::HostDevice dev;
    jss::exchange::DeviceCall device_call;
    device_call.values = values.data();
    device_call.indices = indices.data();
    device_call.cap = cap;
    device_call.out = out.data();
    device_call.stats = stats;
    (void)jss::exchange::sparse_allreduce_on_device(dev, device_call, config, MPI_COMM_WORLD);
    fake_mpi::expect_no_request_pending();
    return 0;
  }

  jss::PreparedCall call;
  const bool prepared =
      jss::prepare_call(values.data(), indices.data(), cap, config, MPI_COMM_WORLD, &call)
          .success();
  fake_mpi::expect_no_request_pending();
  if (!prepared) return 0;
  std::vector<float> out(static_cast<size_t>(config.size), -1.0f);
  jss::SparseResult sparse;
  const bool ran =
      jss::run_call(&call, config, MPI_COMM_WORLD, out.data(), sparse_result ? &sparse : nullptr)
          .success();
  fake_mpi::expect_no_request_pending();
  if (!ran) return 0;
  if (sparse.used) jss::write_sparse_result(sparse, config.size, out.data());
  return 0;
}
