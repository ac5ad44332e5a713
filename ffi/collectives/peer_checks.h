// Checks of what a peer sent, before this rank uses it: a corrupted or
// truncated message (or a peer running another call) must end in an error
// naming the peer and the message, never in an out-of-bounds read or write
// here. Found by the fuzz targets in fuzz/ (scripts/fuzz.sh), which feed the
// collectives arbitrary peer bytes; each check costs O(entries received).
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

#include "kernels/sparse_stream.h"
#include "xla/ffi/api/ffi.h"

namespace jss {

inline xla::ffi::Error corrupt_peer_message(int rank, int peer, const char* what,
                                            const std::string& detail) {
  return xla::ffi::Error(
      xla::ffi::ErrorCode::kDataLoss,
      "jax_sparse_sync: rank " + std::to_string(rank) + " received a corrupt " + what +
          (peer >= 0 ? " from rank " + std::to_string(peer) : std::string(" from its peers")) +
          ": " + detail +
          ". The ranks must make the same collective calls in the same order; a message "
          "corrupted in transit ends the call here instead of writing out of bounds.");
}

// A count (entries or bytes) a peer announced: must lie in [0, max].
inline xla::ffi::Error check_peer_count(int64_t count, int64_t max, int rank, int peer,
                                        const char* what) {
  if (count < 0 || count > max) {
    return corrupt_peer_message(rank, peer, what,
                                "count " + std::to_string(count) + " is not in [0, " +
                                    std::to_string(max) + "]");
  }
  return xla::ffi::Error::Success();
}

// Entries a peer sent (possibly at unaligned addresses, hence memcpy): indices
// strictly increasing (sorted, unique) and within [lo, hi).
inline xla::ffi::Error check_peer_entries(const void* data, int64_t count, int64_t lo, int64_t hi,
                                          int rank, int peer, const char* what) {
  int64_t last = lo - 1;
  for (int64_t i = 0; i < count; ++i) {
    SparseEntry e;
    std::memcpy(&e, static_cast<const char*>(data) + i * sizeof(SparseEntry), sizeof(e));
    if (e.index <= last || e.index >= hi) {
      return corrupt_peer_message(
          rank, peer, what,
          "entry " + std::to_string(i) + " has index " + std::to_string(e.index) +
              (e.index >= hi || e.index < lo
                   ? " outside [" + std::to_string(lo) + ", " + std::to_string(hi) + ")"
                   : std::string(" after index ") + std::to_string(last) +
                         " (entries must be sorted and unique)"));
    }
    last = e.index;
  }
  return xla::ffi::Error::Success();
}

}  // namespace jss
