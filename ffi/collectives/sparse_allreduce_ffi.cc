// Sparse allreduce over MPI, as XLA FFI handlers (CPU).
//
// Input: fixed-capacity COO (values f32[cap], indices s32[cap], padding index
// -1). Output: the dense sum over ranks, f32[size], identical bit for bit on
// every rank, and the wire statistics of this rank (see stats.py).
//
// Every algorithm starts with exchange_headers(): one small allgather that
// checks sizes, algorithm, index ranges and the NaN policy on all ranks at
// once, so bad input fails on every rank with the same message.
#include <mpi.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "ffi/collectives/algorithms.h"
#include "ffi/collectives/allreduce_call.h"
#include "ffi/collectives/device_exchange.h"
#include "ffi/collectives/device_exchange_host.h"
#include "ffi/runtime/mpi_comm.h"
#include "ffi/handlers/signatures.h"
#include "ffi/collectives/sparse_allreduce.h"
#include "ffi/runtime/watchdog.h"
#include "ffi/collectives/wire_codec.h"
#include "kernels/float_bits.h"
#include "kernels/sparse_stream.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace jss {

ffi::Error check_call_config(const CallConfig& config) {
  if (config.quantize_bits != 0 &&
      (config.algorithm != static_cast<int64_t>(Algorithm::kDsarSplitAllgather) ||
       !(config.quantize_bits == 2 || config.quantize_bits == 4 || config.quantize_bits == 8) ||
       config.qsgd_bucket < 1)) {
    return ffi::Error::InvalidArgument(
        "jax_sparse_sync.sparse_allreduce: quantize_bits must be 0, or 2/4/8 with "
        "algorithm='dsar_split_allgather'");
  }
  const WireFormat wire = WireFormat::from_word(config.wire);
  if (!wire.valid() || (config.wire >> 8) != 0) {
    return ffi::Error::InvalidArgument(
        "jax_sparse_sync.sparse_allreduce: wire format word " + std::to_string(config.wire) +
        " is not a value dtype (0 float32, 1 bfloat16, 2 float16) plus 16 x an index encoding "
        "(0 int32, 1 auto)");
  }
  if (!wire.plain() && config.quantize_bits != 0) {
    return ffi::Error::InvalidArgument(
        "jax_sparse_sync.sparse_allreduce: quantize_bits and a 16-bit wire_dtype / "
        "index_encoding='auto' cannot be combined (QSGD codes replace DSAR's dense values)");
  }
  return ffi::Error::Success();
}

CallHeader call_header(const CallConfig& config) {
  CallHeader header;
  header.size = config.size;
  // Variants must agree across ranks too: the check compares this word.
  header.algorithm = config.algorithm | (config.quantize_bits << 16) | (config.wire << 32);
  header.param = config.param;
  return header;
}

ffi::Error prepare_call(const float* v, const int32_t* idx, int64_t cap, const CallConfig& config,
                        MPI_Comm comm, PreparedCall* call) {
  if (auto e = check_call_config(config); e.failure()) return e;
  const WireFormat wire = WireFormat::from_word(config.wire);
  BlockedLabel label(algorithm_name(config.algorithm));
  JSS_MPI_CHECK(MPI_Comm_rank(comm, &call->rank), "MPI_Comm_rank", -1);
  JSS_MPI_CHECK(MPI_Comm_size(comm, &call->nranks), "MPI_Comm_size", call->rank);

  CallHeader header = call_header(config);
  // Slot i holding index i for every i: the input is the dense vector itself
  // (dense_sync's call). The dense algorithm then takes it as is, without a
  // sorted stream of N entries to build and scatter back.
  bool identity = cap == config.size;
  for (int64_t i = 0; i < cap; ++i) {
    identity &= idx[i] == i;
    if (idx[i] < -1 || idx[i] >= config.size) {
      if (!(header.flags & CallHeader::kBadIndex)) {
        header.flags |= CallHeader::kBadIndex;
        header.bad_index = idx[i];
        header.bad_position = i;
      }
    } else if (idx[i] >= 0 && !is_finite_f32(v[i])) {
      header.flags |= CallHeader::kNonFinite;
    }
  }
  // The stream (padding dropped, duplicates merged) is what travels, so its
  // length is the count the other ranks must expect.
  if (identity && config.algorithm == static_cast<int64_t>(Algorithm::kDense)) {
    call->local.dense = true;
    call->local.entries.clear();
    call->local.values.assign(v, v + cap);  // owned: the non-blocking path outlives v
  } else if (!(header.flags & CallHeader::kBadIndex)) {
    stream_from_coo(v, idx, cap, &call->local);
    // What this rank sends is its values rounded to the wire dtype; it keeps
    // the same rounded values for its own part of every sum, so every rank
    // sums the same operands.
    round_entries(&call->local.entries, wire.value_dtype);
  }
  header.nnz = call->local.nnz();
  return exchange_headers(header, comm, call->rank, call->nranks,
                          static_cast<NanPolicy>(config.nan_policy), "sparse_allreduce",
                          &call->headers, &call->stats);
}

ffi::Error run_call(PreparedCall* call, const CallConfig& config, MPI_Comm comm, float* dst,
                    SparseResult* sparse) {
  const int64_t size = config.size;
  const int rank = call->rank, nranks = call->nranks;
  const WireFormat wire = WireFormat::from_word(config.wire);
  WireStats* stats = &call->stats;
  ffi::Error err = ffi::Error::Success();
  // The sparse algorithms count the result's nonzeros from their final
  // entries (O(k P)); a dense result (dense, DSAR, a stream that switched to
  // dense) is scanned below. A scan of N floats per call cost more than the
  // whole sparse allreduce at low density (4M, 0.1%, P = 2: 1.6 of 2.1 ms).
  stats->result_nnz = -1;
  BlockedLabel label(algorithm_name(config.algorithm));
  switch (static_cast<Algorithm>(config.algorithm)) {
    case Algorithm::kDense:
      err = dense_allreduce(call->local, size, comm, rank, nranks, wire, dst, stats);
      break;
    case Algorithm::kAllgather:
      err = allgather_allreduce(call->local, call->headers, size, comm, rank, nranks, wire, dst,
                                stats, sparse);
      break;
    case Algorithm::kRecursiveDoubling:
      err = recursive_doubling_allreduce(std::move(call->local), size, comm, rank, nranks, wire,
                                         dst, stats, sparse);
      break;
    case Algorithm::kSplitAllgather:
    case Algorithm::kDsarSplitAllgather:
      err = split_allgather_allreduce(
          call->local, size, comm, rank, nranks,
          config.algorithm == static_cast<int64_t>(Algorithm::kDsarSplitAllgather),
          DensePhaseQuantization{static_cast<int>(config.quantize_bits), config.qsgd_bucket,
                                 config.seed},
          wire, dst, stats, sparse);
      break;
    case Algorithm::kHashPartition:
      err = hash_partition_allreduce(call->local, size, comm, rank, nranks, wire, dst, stats,
                                     sparse);
      break;
    default:
      return ffi::Error::InvalidArgument("jax_sparse_sync.sparse_allreduce: unknown algorithm id " +
                                         std::to_string(config.algorithm));
  }
  if (err.failure()) return err;
  if (stats->result_nnz < 0) {  // a dense result, in dst or (dst null) in sparse->dense
    stats->result_nnz = count_nonzero(dst != nullptr ? dst : sparse->dense.data(), size);
  }
  stats->algorithm = config.algorithm;
  return ffi::Error::Success();
}

bool sparse_result_seam() {
  static const bool on = [] {
    const char* v = std::getenv("JSS_TEST_SPARSE_RESULT");
    return v != nullptr && v[0] == '1';
  }();
  return on;
}

int device_protocol_seam() {
  static const int mode = [] {
    const char* v = std::getenv("JSS_TEST_DEVICE_PROTOCOL");
    if (v == nullptr) return 0;
    if (std::strcmp(v, "compare") == 0) return 2;
    return v[0] == '1' ? 1 : 0;
  }();
  return mode;
}

void write_sparse_result(const SparseResult& sparse, int64_t size, float* out) {
  std::fill(out, out + size, 0.0f);
  for (const SparseEntry& e : sparse.entries) out[e.index] = e.value;
}

ffi::Error write_stats(const WireStats& stats, ffi::Result<ffi::AnyBuffer>& out) {
  if (out->element_type() == ffi::S64) {
    stats.write(reinterpret_cast<int64_t*>(out->untyped_data()));
  } else if (out->element_type() == ffi::S32) {
    stats.write(reinterpret_cast<int32_t*>(out->untyped_data()));
  } else {
    return ffi::Error::InvalidArgument("jax_sparse_sync: stats must be s32 or s64");
  }
  return ffi::Error::Success();
}

namespace {

// JSS_TEST_DEVICE_PROTOCOL=compare: the CPU path's result and statistics for the
// same call (a second collective, after the device protocol's), which the device
// protocol's must equal bit for bit.
ffi::Error compare_with_cpu_path(const float* values, const int32_t* indices, int64_t cap,
                                 const CallConfig& config, MPI_Comm comm, const float* out,
                                 const int64_t* stats) {
  const std::string seam = "jax_sparse_sync.sparse_allreduce (JSS_TEST_DEVICE_PROTOCOL=compare): ";
  PreparedCall call;
  std::vector<float> expected(static_cast<size_t>(config.size));
  ffi::Error e = prepare_call(values, indices, cap, config, comm, &call);
  if (e.success()) e = run_call(&call, config, comm, expected.data());
  if (e.failure()) {
    return ffi::Error::Internal(seam + "the CPU path failed where the device protocol did not: " +
                                e.message());
  }
  for (int64_t i = 0; i < config.size; ++i) {
    uint32_t a, b;
    std::memcpy(&a, out + i, 4);
    std::memcpy(&b, expected.data() + i, 4);
    if (a != b) {
      return ffi::Error::Internal(seam + "out[" + std::to_string(i) + "] has bits " +
                                  std::to_string(a) + ", the CPU path's " + std::to_string(b));
    }
  }
  int64_t want[WireStats::kFields];
  call.stats.write(want);
  for (int f = 0; f < WireStats::kFields; ++f) {
    if (stats[f] != want[f]) {
      return ffi::Error::Internal(seam + "stats field " + std::to_string(f) + " is " +
                                  std::to_string(stats[f]) + ", the CPU path's " +
                                  std::to_string(want[f]));
    }
  }
  return ffi::Error::Success();
}

// The call through the device protocol's host stand-ins (JSS_TEST_DEVICE_PROTOCOL).
ffi::Error run_device_protocol_seam(const float* values, const int32_t* indices, int64_t cap,
                                    const CallConfig& config, MPI_Comm comm, float* out,
                                    ffi::Result<ffi::AnyBuffer>& stats_out) {
  exchange::HostDevice dev;
  int64_t stats[WireStats::kFields] = {};
  exchange::DeviceCall call;
  call.values = values;
  call.indices = indices;
  call.cap = cap;
  call.out = out;
  call.stats = stats;
  if (auto e = exchange::sparse_allreduce_on_device(dev, call, config, comm); e.failure()) return e;
  if (device_protocol_seam() == 2) {
    // JSS_TEST_DEVICE_PROTOCOL_FLIP=1 (read on each call): the low bit of out[0]
    // flipped first, so a test sees that the comparison runs and catches one bit.
    const char* flip = std::getenv("JSS_TEST_DEVICE_PROTOCOL_FLIP");
    if (flip != nullptr && flip[0] == '1' && config.size > 0) {
      uint32_t bits;
      std::memcpy(&bits, out, 4);
      bits ^= 1u;
      std::memcpy(out, &bits, 4);
    }
    if (auto e = compare_with_cpu_path(values, indices, cap, config, comm, out, stats);
        e.failure()) {
      return e;
    }
  }
  WireStats written{stats[0], stats[1], stats[2], stats[3], stats[4], stats[5]};
  return write_stats(written, stats_out);
}

ffi::Error SparseAllreduceImpl(ffi::Token, ffi::Buffer<ffi::F32> values,
                               ffi::Buffer<ffi::S32> indices, ffi::Buffer<ffi::S32> seed,
                               ffi::Result<ffi::Token>,
                               ffi::ResultBuffer<ffi::F32> out, ffi::Result<ffi::AnyBuffer> stats_out,
                               int64_t size, int64_t algorithm, int64_t comm_handle,
                               int64_t nan_policy, int64_t quantize_bits, int64_t qsgd_bucket,
                               int64_t wire) {
  const int64_t cap = static_cast<int64_t>(values.element_count());
  if (static_cast<int64_t>(indices.element_count()) != cap ||
      static_cast<int64_t>(out->element_count()) != size) {
    return ffi::Error::InvalidArgument(
        "jax_sparse_sync.sparse_allreduce: `values`/`indices` lengths or output size mismatch");
  }
  CallConfig config{size, algorithm, nan_policy, quantize_bits, qsgd_bucket,
                    static_cast<uint32_t>(seed.typed_data()[0])};
  config.wire = wire;
  MPI_Comm comm = comm_from_handle(comm_handle);
  WatchdogScope watchdog("sparse_allreduce", comm);
  if (device_protocol_seam() != 0 && exchange::runs_on_device(algorithm)) {
    return run_device_protocol_seam(values.typed_data(), indices.typed_data(), cap, config, comm,
                                    out->typed_data(), stats_out);
  }
  PreparedCall call;
  if (auto e = prepare_call(values.typed_data(), indices.typed_data(), cap, config, comm, &call);
      e.failure()) {
    return e;
  }
  if (sparse_result_seam()) {
    SparseResult sparse;
    if (auto e = run_call(&call, config, comm, out->typed_data(), &sparse); e.failure()) return e;
    if (sparse.used) write_sparse_result(sparse, size, out->typed_data());
    return write_stats(call.stats, stats_out);
  }
  if (auto e = run_call(&call, config, comm, out->typed_data()); e.failure()) return e;
  return write_stats(call.stats, stats_out);
}

}  // namespace
}  // namespace jss

XLA_FFI_DEFINE_HANDLER_SYMBOL(JssSparseAllreduce, jss::SparseAllreduceImpl,
                              jss::sig::bind_sparse_allreduce(ffi::Ffi::Bind()));
