// The watchdog's settings (ffi/runtime/watchdog.h) as Python functions. Each nanobind
// module links its own copy of the MPI layer, so jax_sparse_sync sets both
// (see jax_sparse_sync/mpi/watchdog.py); `tag` names this module's record file.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <cstdint>
#include <string>

#include "ffi/collectives/algorithms.h"
#include "ffi/runtime/mpi_comm.h"
#include "ffi/runtime/watchdog.h"

namespace jss {

inline void def_watchdog(nanobind::module_& m, const char* tag) {
  watchdog_set_module_tag(tag);
  m.def("watchdog_set_timeout_ns", [](int64_t ns) { watchdog_set_timeout_ns(ns); });
  m.def("watchdog_timeout_ns", []() { return watchdog_timeout_ns(); });
  m.def("watchdog_set_exit_code", [](int code) { watchdog_set_exit_code(code); });
  m.def("watchdog_directory", []() { return watchdog_directory(); });
  m.def("watchdog_remove_record", []() { watchdog_remove_record(); });
  m.def("watchdog_pair_cost_ns", [](int64_t comm, int64_t iterations) {
    return watchdog_pair_cost_ns(comm, iterations);
  });
  // communicator ids (ffi/runtime/mpi_comm.h): each module keeps its own table, like the watchdog
  m.def("register_comm_id", [](int64_t index, int64_t fortran_handle) {
    register_comm_id(index, fortran_handle);
  });
  m.def("take_mpi_error_seen", []() { return take_mpi_error_seen(); });
  m.attr("COMM_ID_BASE") = kCommIdBase;
  m.attr("COMM_ID_CAPACITY") = kCommIdCapacity;
  // the tags of the point-to-point exchanges (tests probe for a peer's message by them)
  m.attr("TAG_HEADERS") = kTagHeaders;  // the argument check
  m.attr("TAG_COUNTS") = kTagCounts;    // message sizes before point-to-point data
  m.attr("TAG_DATA") = kTagData;        // the algorithms' data messages
  m.attr("TAG_COUNT") = kTagCount;      // recursive doubling's lengths, Ok-Topk's balancing
  m.def("watchdog_entered_count", []() { return watchdog_entered_count(); });
  m.def("blocked_on_pair_cost_ns", [](int64_t iterations) {
    return blocked_on_pair_cost_ns(iterations);
  });
}

}  // namespace jss
