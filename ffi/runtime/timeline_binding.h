// The non-blocking operations' timeline (see collectives_host.h) as a Python
// list of tuples in TimelineRecord's field order. Each nanobind module links
// its own private copy of the MPI layer (hidden symbols), so the CPU and the
// CUDA module each keep the timeline of the operations they ran; both expose
// it through this one function and jax_sparse_sync merges them.
#pragma once

#include <nanobind/nanobind.h>

#include "ffi/collectives/collectives_host.h"

namespace jss {

inline void def_nonblocking_timeline(nanobind::module_& m) {
  // how many duplicate communicators the non-blocking operations rotate through
  m.attr("NONBLOCKING_SLOTS") = kNonblockingSlots;
  m.def("nonblocking_timeline", [](bool clear) {
    nanobind::list out;
    for (const TimelineRecord& r : nonblocking_timeline(clear)) {
      out.append(nanobind::make_tuple(r.op, r.size, r.bytes_sent, r.start_ns, r.checked_ns,
                                      r.wire_begin_ns, r.wire_end_ns, r.done_ns,
                                      r.done_exit_ns));
    }
    return out;
  }, nanobind::arg("clear") = true);
}

}  // namespace jss
