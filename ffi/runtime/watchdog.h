// A watchdog for stuck collectives (the analogue of PyTorch's process-group
// timeout). Every MPI collective entry point of the library (the blocking and
// non-blocking sparse allreduce, the dense allreduce, Ok-Topk, the block allreduce) brackets its
// work with watchdog_enter()/watchdog_exit(). With a timeout set, a watchdog
// thread ends the job (MPI_Abort on COMM_WORLD) when an operation has not
// completed `timeout` after this rank entered it, after printing which
// operation it was (name and sequence number on its communicator), this rank,
// and which ranks of the communicator had not entered it yet, with what each
// of them last entered, and where each thread of this rank waits inside the
// library's MPI calls (ffi/runtime/blocked_on.h: the peer and the bytes of a
// point-to-point wait, the collective otherwise), which names the peer behind
// a dead link when every rank entered the operation.
//
// What the other ranks last entered is read from files, not through MPI: a
// stuck peer makes no MPI progress, so asking it would hang too. While the
// watchdog is on, each rank's watcher thread rewrites one small record file in
// a job-shared directory ($JSS_WATCHDOG_DIR, else /dev/shm/jss-<job id>) when
// the state changed, at most once per poll (timeout / 20, 10 ms to 0.5 s): the
// collectives themselves make no system call for it. Ranks on other nodes are
// only visible if that directory is shared.
//
// Cost per collective: off, two short critical sections (the per-communicator
// sequence number and the last operation entered are always kept, so that
// numbers agree across ranks and the record is complete even when the timeout
// is set mid-run; the communicator's members are looked up once, at its first
// use); on, also an entry in the table of operations in flight.
#pragma once

#include <mpi.h>

#include <cstdint>

#include "ffi/runtime/blocked_on.h"
#include <string>

namespace jss {

// Timeout in nanoseconds for operations entered from now on; 0 turns it off.
void watchdog_set_timeout_ns(int64_t ns);
int64_t watchdog_timeout_ns();
// Exit status passed to MPI_Abort when the watchdog fires.
void watchdog_set_exit_code(int code);
// Distinguishes the record files of the CPU and CUDA modules (each links its
// own copy of this layer).
void watchdog_set_module_tag(const std::string& tag);
// The directory the record files go to (resolved from the environment).
std::string watchdog_directory();
// Removes this rank's record file (and the directory, once empty): at a clean
// exit, so that records outlive only the jobs that did not end cleanly.
void watchdog_remove_record();
// Operations this module has entered (all communicators); for tests.
int64_t watchdog_entered_count();

// One entered operation, for watchdog_exit.
struct WatchdogTicket {
  int64_t comm = 0;
  int64_t seq = 0;     // its number on the communicator (1 = the first)
  int64_t token = -1;  // its entry in the table the watcher checks (-1: not timed)
};

// Registers the entry of collective `op` (a string literal) on the
// communicator whose Fortran handle is `comm_handle`.
WatchdogTicket watchdog_enter(const char* op, int64_t comm_handle, MPI_Comm comm);
void watchdog_exit(const WatchdogTicket& ticket);

// Average cost in ns of one enter/exit pair on the communicator `comm_handle`
// (which it advances by `iterations` operations: use a communicator of its own).
// For benchmarks/watchdog.py: the watchdog's cost per collective, off or on.
double watchdog_pair_cost_ns(int64_t comm_handle, int64_t iterations);

// Tells the watchdog that communicator `dup_handle` (a duplicate made by the
// library, e.g. a non-blocking slot's) has the ranks of `original_handle`, so
// that its report names the peers a thread waits for there by world rank.
void watchdog_note_duplicate(int64_t dup_handle, int64_t original_handle, MPI_Comm original);

// RAII bracket for a blocking collective.
class WatchdogScope {
 public:
  WatchdogScope(const char* op, MPI_Comm comm);
  ~WatchdogScope() { watchdog_exit(ticket_); }
  WatchdogScope(const WatchdogScope&) = delete;
  WatchdogScope& operator=(const WatchdogScope&) = delete;

 private:
  WatchdogTicket ticket_;
};

}  // namespace jss
