// Zeroing a large dense output without reading it first: the N-float fill under
// the sparse allreduce's dense result (the sparse entries are added into it).
//
// A plain fill (std::fill; glibc's memset below its non-temporal threshold, which
// on a host with a large L3 is larger than most models' outputs) reads every cache
// line before writing it (read for ownership) and leaves the vector in the caches,
// evicting what was there: twice the memory traffic of the zeros themselves.
// Streaming stores write whole lines without reading them. On the 2-core
// development VM (Xeon, busy), 10M floats and then 10K sorted entries written into
// them: the streamed fill took about half the time of memset's or of the fill
// interleaved with the entries (what the allgather algorithm did before), at 100K
// entries 0.6x (a standalone microbenchmark, minimum and median of 200 runs each,
// taking turns); the whole call: benchmarks/sparse_allreduce_host.py.
// Below kStreamingFillMin the vector fits in the caches, where the next operation
// reads it, so a plain fill is kept there.
#pragma once

#include <algorithm>
#include <cstdint>

#if defined(__SSE2__) && !defined(JSS_NO_SIMD)
#include <emmintrin.h>
#define JSS_STREAMING_FILL 1
#endif

namespace jss {

// Outputs of at least this many floats (4 MiB) are zeroed with streaming stores
// (SSE2, x86-64's baseline; other CPUs and -DJSS_NO_SIMD builds: std::fill).
constexpr int64_t kStreamingFillMin = int64_t{1} << 20;

// out[0, n) = +0.0f. After it returns the zeros are ordered before any later store
// of this thread (the streaming stores are fenced), so entries written next land
// on top of them.
inline void zero_fill(float* out, int64_t n) {
#if defined(JSS_STREAMING_FILL)
  if (n >= kStreamingFillMin) {
    float* p = out;
    float* const end = out + n;
    // floats are 4-byte aligned; the streaming stores want 16
    while (p < end && (reinterpret_cast<std::uintptr_t>(p) & 15) != 0) *p++ = 0.0f;
    const __m128 zero = _mm_setzero_ps();
    for (; end - p >= 4; p += 4) _mm_stream_ps(p, zero);
    while (p < end) *p++ = 0.0f;
    _mm_sfence();
    return;
  }
#endif
  std::fill(out, out + n, 0.0f);
}

}  // namespace jss
