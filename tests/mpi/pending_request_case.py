"""An MPI error in the middle of an exchange leaves no request pending and no
message that a later call could match: run by tests/test_multirank.py under
``mpiexec -n 3`` with ``tests/mpi/fail_isend_shim.c`` preloaded (``LD_PRELOAD``).
Before each case, every rank arms the shim (``jss_test_fail_isend(tag, skip,
delay_ms)``, through ctypes) to fail one of its next ``MPI_Isend`` calls with the
tag of one point-to-point exchange: the argument check's headers (7104), the
counts before the data (7103), or an algorithm's data messages (7102:
split-allgather's and hash partition's slices, the block-sparse allreduce's
blocks, Ok-Topk's buckets, and split-allgather's slices on the worker thread of a
non-blocking operation).

In the first cases every rank fails its first send of the exchange, after the
call posted its receives from the peers. It must raise, naming the MPI call, and
cancel those receives: left pending, one would match the peer's message of the
next call on the communicator (receives match in the order posted) and write it
into the failed call's freed buffer, so the next call would wait for ever.

In the ``after_a_send`` cases the last rank fails its second send, after its
first one (to rank 0) was posted, late enough that rank 0 has failed and
cancelled its receive already: that message, small (delivered whole, eager) or
above MPICH's eager size (in flight, its sender's request left active), has no
receive on rank 0. MPI cannot cancel a send, so ``jss.mpi.reset_after_mpi_error``
moves the library to a fresh duplicate communicator; without it the next call's
receive on rank 0 matches the stale message (a wrong sum, or the freed send
buffer read). That the message was there is checked, not assumed: rank 0 must
find it with ``MPI_Iprobe`` on the retired communicator (the one the failed call
ran on, now in ``jax_sparse_sync.mpi.comm._RETIRED``) and not on the fresh one.
Only if rank 0 was descheduled for longer than the delay can the message meet
the failed call's receive while still posted: the shim then reports that
receive's cancel as too late (``MPI_Test_cancelled``), the case says so and
fails again, up to ``STALE_ATTEMPTS`` times, and fails if the stale path never
ran.

What the failed call cancelled is counted by the shim (which watches the
library's MPI_Isend / MPI_Irecv posts and its MPI_Cancel calls): on every rank,
in every case, at least one receive and no send (MPI_Cancel of a send that had
just completed crashed in UCX; ``jss::cancel_pending`` takes each request's kind
from the library's records of its peers). In the ``after_a_send`` cases the last
rank's first send is still posted when it cancels (in flight, for the large
message): a send recorded as a receive would be counted there.

After each failure the same call runs again, each time on new data, and must
return the NumPy reference on every rank (a hang ends in the caller's timeout). A
non-blocking operation runs on the duplicate communicator of its slot (operation
number mod NONBLOCKING_SLOTS), so after its failure that many more run: the last
one uses the failed one's slot again.

Usage: ``LD_PRELOAD=libfail_isend.so mpiexec -n 3 python -m mpi4py
tests/mpi/pending_request_case.py [CASE ...]`` (default: every case); prints
``PENDING OK`` on rank 0.
"""

import ctypes
import sys
import time

import jax
import numpy as np
from mpi4py import MPI

import jax_sparse_sync as jss
from jax_sparse_sync import _ext
from jax_sparse_sync.mpi import comm as jss_comm

WORLD = MPI.COMM_WORLD
P, RANK = WORLD.Get_size(), WORLD.Get_rank()
BLOCK = 16
NONBLOCKING_SLOTS = _ext.cpu_module.NONBLOCKING_SLOTS  # ffi/collectives/collectives_host.h
# the exchanges' tags (ffi/runtime/mpi_comm.h, ffi/collectives/algorithms.h)
TAG_HEADERS = _ext.cpu_module.TAG_HEADERS
TAG_COUNTS = _ext.cpu_module.TAG_COUNTS
TAG_DATA = _ext.cpu_module.TAG_DATA
# after_a_send cases: failures tried until rank 0's receive was cancelled before the
# late message came (the stale path); how long rank 0 looks for that message
STALE_ATTEMPTS = 4
PROBE_SECONDS = 10.0


def sparse(algorithm):
    fn = jax.jit(lambda v, i, size: jss.sparse_allreduce(v, i, size=size, algorithm=algorithm),
                 static_argnames="size")
    return lambda data: fn(data["values"], data["indices"], size=data["dense"].size)


def oktopk(data):
    # k above the nonzeros of the sum: Ok-Topk keeps every entry, the sum itself
    return jss.oktopk_allreduce(data["values"], data["indices"], size=data["dense"].size,
                                k=P * data["values"].size).sum


def block(data):
    return jss.block_allreduce(data["dense"], block_size=BLOCK)


def nonblocking(data):
    pending = jss.sparse_allreduce_start(data["values"], data["indices"],
                                         size=data["dense"].size, algorithm="split_allgather")
    return jss.sparse_allreduce_done(pending)


def first_send(rank):
    """Every rank fails its first send of the exchange: (skip, delay_ms) for the shim."""
    return 0, 0


def after_a_send(rank):
    """Ranks 0 .. P-2 fail their first send; the last rank lets its first one
    through (to rank 0: split-allgather sends to rank + 1 first), 300 ms late, so
    that rank 0 has failed and cancelled its receive from it by then, and fails
    its second. Its message then reaches rank 0 with no receive posted for it."""
    return (1, 300) if rank == P - 1 else (0, 0)


# name: (the call to run, the tag whose MPI_Isend fails, what the error names, how
# many times the call runs after the failure, which send fails on each rank, (N, K))
SMALL = (1024, 16)
# slices of 16,384 entries (128 KiB in the default wire format), above MPICH's eager size for
# shared memory: such a send stays in flight until a receive matches it
LARGE = (1 << 18, 3 * 16384)
CASES = {
    "argument_check": (sparse("allgather"), TAG_HEADERS, "MPI_Isend (argument check)", 1,
                       first_send, SMALL),
    "counts": (sparse("split_allgather"), TAG_COUNTS, "MPI_Isend (counts)", 1, first_send, SMALL),
    "split_allgather": (sparse("split_allgather"), TAG_DATA, "MPI_Isend (slice)", 1, first_send,
                        SMALL),
    "hash_partition": (sparse("hash_partition"), TAG_DATA, "MPI_Isend (slice)", 1, first_send,
                       SMALL),
    "block_allreduce": (block, TAG_DATA, "MPI_Isend (phase 1 blocks)", 1, first_send, SMALL),
    "oktopk": (oktopk, TAG_DATA, "MPI_Isend (bucket)", 1, first_send, SMALL),
    "nonblocking": (nonblocking, TAG_DATA, "MPI_Isend (slice)", NONBLOCKING_SLOTS, first_send,
                    SMALL),
    # P >= 3: a failure after a send was posted, whose message is eager (delivered
    # whole) or above the eager limit (in flight); two calls after it, each on new data
    "after_a_send_eager": (sparse("split_allgather"), TAG_DATA, "MPI_Isend (slice)", 2,
                           after_a_send, SMALL),
    "after_a_send_large": (sparse("split_allgather"), TAG_DATA, "MPI_Isend (slice)", 2,
                           after_a_send, LARGE),
}


def inputs(seed, n, k):
    """This rank's entries (k // P in each P-th of [0, n), so every rank sends to
    every other in each exchange), drawn from `seed` (so each call of a case sums
    other data: a message of an earlier call that reached this one would show in
    the sum), their dense vector, and the reference sum of all ranks."""
    rng = np.random.default_rng([RANK, *seed])
    chunk, per = n // P, k // P
    indices = np.concatenate([q * chunk + rng.choice(chunk, per, replace=False)
                              for q in range(P)])
    values = rng.integers(1, 9, indices.size).astype(np.float32)  # small integers: exact sums
    dense = np.zeros(n, np.float32)
    dense[indices] = values
    expected = np.sum(WORLD.allgather(dense), axis=0, dtype=np.float32)
    return {"values": values, "indices": indices.astype(np.int32), "dense": dense}, expected


def take_cancels(shim):
    """(sends, receives, unknown handles) the library passed to MPI_Cancel since
    the last call, as the shim counted them."""
    counts = [ctypes.c_int() for _ in range(3)]
    shim.jss_test_take_cancels(*(ctypes.byref(c) for c in counts))
    return tuple(c.value for c in counts)


def take_cancel_outcomes(shim):
    """(cancelled, matched, unresolved): of the receives the library passed to
    MPI_Cancel since the last call, those whose cancel took effect, those that had
    matched a message first (the cancel too late), and those no MPI_Test completed."""
    counts = [ctypes.c_int() for _ in range(3)]
    shim.jss_test_take_cancel_outcomes(*(ctypes.byref(c) for c in counts))
    return tuple(c.value for c in counts)


def communicator_in_use():
    """The communicator the default communicator's id runs on now (its latest
    duplicate after a reset that renewed it)."""
    index = jss_comm.comm_attribute(jss_comm.default_comm()) - _ext.cpu_module.COMM_ID_BASE
    return jss_comm._IN_USE[index]


def probe(comm, seconds):
    """The byte count of a message from the last rank with the data tag waiting on
    `comm`, looked for (MPI_Iprobe, which also makes progress) for up to `seconds`;
    None if none came."""
    status = MPI.Status()
    deadline = time.monotonic() + seconds
    while True:
        if comm.Iprobe(source=P - 1, tag=TAG_DATA, status=status):
            return status.Get_count(MPI.BYTE)
        if time.monotonic() > deadline:
            return None
        time.sleep(0.001)


def fail_once(shim, name, seed):
    """Runs the case's call with the shim armed: it must raise naming the MPI call
    and cancel receives only. Then the reset. Returns whether the stale path ran:
    for the after_a_send cases, whether the last rank's first message reached rank 0
    after the failed call had cancelled its receive (then rank 0 finds it on the
    retired communicator), decided on rank 0 and agreed by every rank; else None."""
    call, tag, mpi_call, _, arming, (n, k) = CASES[name]
    data, _ = inputs(seed, n, k)
    failed_comm = communicator_in_use()
    take_cancels(shim)  # from here on: this failure's
    take_cancel_outcomes(shim)
    shim.jss_test_fail_isend(tag, *arming(RANK))
    try:
        np.asarray(call(data))
    except Exception as e:  # noqa: BLE001 (XLA's runtime error type)
        assert mpi_call in str(e), (name, str(e)[:500])
    else:
        raise AssertionError(f"{name}: the injected MPI_Isend failure (tag {tag}) did not raise")
    sends, receives, unknown = take_cancels(shim)
    assert sends == 0 and unknown == 0, (
        f"{name}: rank {RANK} cancelled {sends} send(s) and {unknown} request(s) it did not "
        "post (only receives may be cancelled)")
    assert receives >= 1, f"{name}: rank {RANK} cancelled no receive (one is left pending)"
    cancelled, matched, unresolved = take_cancel_outcomes(shim)
    assert cancelled + matched + unresolved == receives, (name, RANK, cancelled, matched,
                                                          unresolved, receives)
    if arming is first_send:
        # no message of the failed call is left in flight: the reset keeps the
        # communicator (the error flag cleared first), so a receive the failed call
        # left posted would match the next call's message here (the cancel's test)
        for module in (_ext.cpu_module, _ext.cuda_module):
            if module is not None:
                module.take_mpi_error_seen()
    jss.mpi.reset_after_mpi_error()  # after a send: a fresh communicator
    print(f"case {name}: rank {RANK} raised naming {mpi_call!r}, cancelled {receives} "
          "receive(s) and no send", flush=True)
    if arming is not after_a_send:
        return None
    fresh_comm = communicator_in_use()
    assert fresh_comm is not failed_comm and any(c is failed_comm for c in jss_comm._RETIRED), (
        f"{name}: the reset did not move the library off the failed call's communicator")
    stale = None
    if RANK == 0:
        # only the last rank sent rank 0 anything (the others failed their first send)
        stale = matched == 0 and unresolved == 0
        if stale:  # every receive cancelled before the message came: it must be waiting
            nbytes = probe(failed_comm, PROBE_SECONDS)
            assert nbytes is not None, (
                f"{name}: rank 0 cancelled all its receives, yet no message from rank {P - 1} "
                f"(tag {TAG_DATA}) waits on the retired communicator after {PROBE_SECONDS} s")
            assert probe(fresh_comm, 0.0) is None, (
                f"{name}: rank {P - 1}'s message of the failed call is on the fresh communicator")
            print(f"case {name}: stale path: rank {P - 1}'s message ({nbytes} B) reached rank 0 "
                  "after it had cancelled its receive, and waits on the retired communicator",
                  flush=True)
        else:
            assert probe(failed_comm, 0.0) is None, (
                f"{name}: rank 0's receive took rank {P - 1}'s message, yet another waits")
            print(f"case {name}: rank 0 was late: rank {P - 1}'s message met its receive still "
                  f"posted ({matched} matched, {unresolved} not completed after its cancel); "
                  "the stale path did not run, failing again", flush=True)
    return WORLD.bcast(stale, root=0)


def main(names):
    shim = ctypes.CDLL(None)  # the preloaded shim's functions
    for case_number, name in enumerate(names):
        call, _, _, reruns, arming, (n, k) = CASES[name]
        if arming is after_a_send:
            assert P >= 3, f"case {name} needs 3 ranks or more (the failure after a send)"
            for attempt in range(STALE_ATTEMPTS):
                if fail_once(shim, name, (case_number, 0, attempt)):
                    break
            else:
                raise AssertionError(
                    f"{name}: in {STALE_ATTEMPTS} failures rank 0's receive always took the "
                    "late message: the stale path never ran (a machine too loaded?)")
        else:
            fail_once(shim, name, (case_number, 0))
        for rerun in range(1, reruns + 1):
            data, expected = inputs((case_number, rerun), n, k)
            np.testing.assert_array_equal(np.asarray(call(data)), expected,
                                          err_msg=f"{name}, call {rerun} after the failure")
        WORLD.Barrier()
        if RANK == 0:
            print(f"case {name}: then the reference", flush=True)
    if RANK == 0:
        print("PENDING OK", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:] or list(CASES))
