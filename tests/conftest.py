import os
import shutil
import sys
import tempfile

import pytest

# tests import the shared NumPy reference as `reference`
sys.path.insert(0, os.path.dirname(__file__))


#: MPICH's heavy yield: a rank waiting in MPI (a collective, the outcome agreement of
#: tests/mpi/conftest.py) calls nanosleep every 1,000 polls instead of sched_yield. On CI's
#: 2 cores every job shares them with the other xdist worker, or outnumbers them (3 and 8
#: ranks), and a waiting rank that only yields keeps spinning on a core that a rank still
#: tracing, compiling or computing needs. Measured with a fresh compilation cache, the
#: same files run as `mpiexec -n P python -m pytest`: P = 3, tests/mpi/test_topk_sync_mpi,
#: test_wire_format_mpi, test_dense_allreduce_mpi: 52-70 s wall, 81-91 CPU-s without it,
#: 37-40 s and 53-62 CPU-s with it (system time 20-27 s -> 3 s); P = 8,
#: test_sparse_allreduce_mpi: 41 s and 76 CPU-s -> 31 s and 52 CPU-s; P = 2 with the
#: cores to itself: unchanged (26 s). Only waiting changes, never a message or a result.
#: Set for every job the suite starts (inherited); an environment that sets it wins,
#: except where tests/test_multirank.py turns it off (4+ ranks and the non-blocking file).
CONTENDED_MPI_ENV = {"MPIR_CVAR_ENABLE_HEAVY_YIELD": "1"}


#: XLA's CPU backend without LLVM's optimization passes, for every process of the suite
#: (inherited by its subprocesses and ``mpiexec`` ranks): the suite runs programs on tiny
#: inputs, where compiling is most of a test's time. Measured one after the other on the
#: 2 cores, a fresh compilation cache each, with and without it: the jax.distributed pair
#: (2 processes x 4 devices) 37 -> 24 s; four of the slowest 8-device axis cases 55 / 48 ->
#: 39 / 44 s. (The multi-rank suite's jobs and the 8-device processes also compile
#: fusions without XLA's MLIR fusion emitters: tests/test_multirank.py, FAST_EMITTER_FLAG.)
#: What it changes: how LLVM turns XLA's own loops into machine code, and with it the
#: last bits of some float results (an 8-device Ok-Topk sync run at this level differed
#: from the MPI run of a default build). Every bit-for-bit comparison in the suite is
#: between programs compiled in the same run (replicas, MPI against the mesh transport:
#: tests/test_axis_transport.py makes its MPI results in the session), so each holds
#: alike; our FFI kernels and Eigen's are our builds, unchanged. ``JSS_TEST_FAST_COMPILE=0``
#: compiles as users do (the suite passed so through 0daf0bd); an ``XLA_FLAGS`` that sets
#: the level itself wins.
FAST_COMPILE_FLAG = "--xla_backend_optimization_level=0"


def pytest_configure(config):
    for name, value in CONTENDED_MPI_ENV.items():
        os.environ.setdefault(name, value)
    _configure_fast_compile()
    _configure_compile_cache(config)


def _configure_fast_compile():
    """Adds FAST_COMPILE_FLAG to ``XLA_FLAGS`` (read when JAX first makes its CPU client,
    after this hook: the suite's tests and plugins create no device at import)."""
    flags = os.environ.get("XLA_FLAGS", "")
    if os.environ.get("JSS_TEST_FAST_COMPILE", "1") == "0" or \
            "--xla_backend_optimization_level" in flags:
        return
    os.environ["XLA_FLAGS"] = f"{flags} {FAST_COMPILE_FLAG}".strip()


def _configure_compile_cache(config):
    """One JAX compilation cache for the whole session, subprocesses included.

    Most of the suite's time is XLA compiling the same programs again: every rank
    of every ``mpiexec`` job (tests/test_multirank.py runs tests/mpi at 2, 3, 4
    and 8 ranks), every benchmark and example run as a subprocess. The cache lives
    in a fresh directory for this session only (a clean checkout compiles
    everything once), its path handed to the subprocesses through the
    environment. A cache hit is the executable XLA compiled from the same HLO, so
    every test still traces, lowers and runs what it did. Set
    ``JSS_TEST_COMPILE_CACHE=0`` to compile everything everywhere (or set
    ``JAX_COMPILATION_CACHE_DIR`` to use a cache of your own).
    """
    if os.environ.get("JSS_TEST_COMPILE_CACHE", "1") == "0":
        return
    if not os.environ.get("JAX_COMPILATION_CACHE_DIR"):
        if "PMI_RANK" in os.environ or "OMPI_COMM_WORLD_RANK" in os.environ:
            return  # a rank of an mpiexec job started by hand: no directory to share
        path = tempfile.mkdtemp(prefix="jss_test_jax_cache_")
        config.add_cleanup(lambda: shutil.rmtree(path, ignore_errors=True))
        os.environ["JAX_COMPILATION_CACHE_DIR"] = path
    # every compilation, however short: the ranks of a job compile the same programs
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
    if "jax" in sys.modules:  # imported already (a plugin): JAX read its settings then
        import jax

        jax.config.update("jax_compilation_cache_dir", os.environ["JAX_COMPILATION_CACHE_DIR"])
        jax.config.update("jax_persistent_cache_min_compile_time_secs",
                          float(os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"]))
        jax.config.update("jax_persistent_cache_min_entry_size_bytes",
                          int(os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"]))
    _compile_once_per_cache_key()
    _record_compile_stats()


def _record_compile_stats():
    """With ``JSS_TEST_COMPILE_STATS=<dir>``, each pytest process (every rank of
    every ``mpiexec`` job included) writes one JSON line there at exit: how many
    programs it compiled, how many it read from the persistent cache, and the
    seconds spent tracing, lowering and compiling. Measures where the suite's
    time goes (docs/topics/test_suite.md); off by default."""
    out_dir = os.environ.get("JSS_TEST_COMPILE_STATS")
    if not out_dir:
        return
    import atexit
    import collections
    import json
    import time

    from jax import monitoring

    counts = collections.Counter()
    seconds = collections.Counter()
    monitoring.register_event_listener(lambda event, **kw: counts.update([event]))
    monitoring.register_event_duration_secs_listener(
        lambda event, duration, **kw: seconds.update({event: duration}))
    start = time.monotonic()

    def write():
        os.makedirs(out_dir, exist_ok=True)
        line = {"argv": sys.argv[1:], "rank": os.environ.get("PMI_RANK"),
                "size": os.environ.get("PMI_SIZE"), "wall_s": time.monotonic() - start,
                # CPU seconds of this process: what it cost, however loaded the machine was
                "cpu_s": os.times().user + os.times().system,
                "counts": dict(counts), "seconds": dict(seconds)}
        with open(os.path.join(out_dir, f"{os.getpid()}.json"), "w") as f:
            json.dump(line, f)

    atexit.register(write)


# How long a process waits for another to finish compiling the same program before
# compiling it itself: a compilation takes seconds, so this is only reached where
# the other process is stopped (SIGSTOP) mid-compilation; waiting can never hang.
COMPILE_LOCK_WAIT_S = 120.0


def _compile_once_per_cache_key():
    """The ranks of an ``mpiexec`` job compile one program once, not once each.

    Every rank of a job runs the same tests in the same order, so all P ranks miss
    the cache for the same program at the same moment and compile it P times over
    (on two cores, with P up to 8). Here a miss takes a lock file named by the
    cache key, looks again, and compiles only if the program is still not there:
    the first rank compiles and writes, the others wait (asleep, leaving the cores
    to it) and then read what it wrote. A lock is per program and held only while
    compiling, never across a collective; a holder that dies releases it, and a
    waiter gives up after COMPILE_LOCK_WAIT_S and compiles itself, so no rank can
    be left waiting. Only where JAX has the internals this wraps (else unchanged);
    ``JSS_TEST_COMPILE_ONCE=0`` turns it off.
    """
    if os.environ.get("JSS_TEST_COMPILE_ONCE", "1") == "0":
        return
    try:
        import fcntl
        import time

        from jax._src import compiler, monitoring
    except ImportError:
        return
    compile_and_write = getattr(compiler, "_compile_and_write_cache", None)
    cache_read = getattr(compiler, "_cache_read", None)
    if compile_and_write is None or cache_read is None or getattr(
            compile_and_write, "_jss_once", False):
        return
    # JAX's private signatures change between releases (0.11 added
    # ``host_callbacks`` to ``_cache_read``): the arguments are matched by name,
    # and where a parameter cannot be supplied the wrapper is not installed
    import inspect

    try:
        write_sig = inspect.signature(compile_and_write)
        read_params = inspect.signature(cache_read).parameters
    except (TypeError, ValueError):
        return
    if "cache_key" not in write_sig.parameters or any(
            p.default is inspect.Parameter.empty and name not in write_sig.parameters
            for name, p in read_params.items()):
        return
    lock_dir = os.path.join(os.environ["JAX_COMPILATION_CACHE_DIR"], "jss_compile_locks")

    def locked_compile_and_write(*args, **kwargs):
        given = write_sig.bind(*args, **kwargs).arguments
        try:
            os.makedirs(lock_dir, exist_ok=True)
            fd = os.open(os.path.join(lock_dir, f"{given['cache_key']}.lock"),
                         os.O_CREAT | os.O_RDWR)
        except OSError:
            fd = None
        try:
            deadline = time.monotonic() + COMPILE_LOCK_WAIT_S
            while fd is not None:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        break  # compile without the lock
                    time.sleep(0.02)
            # another process may have written the program while this one waited
            try:
                found = cache_read(**{name: given[name] for name in read_params if name in given})
            except TypeError:  # another JAX's private signature: compile as JAX would
                found = None
            executable = found[0] if isinstance(found, tuple) else found
            if executable is not None:
                monitoring.record_event("/jss/compile_once/written_by_another_process")
                return executable
            return compile_and_write(*args, **kwargs)
        finally:
            if fd is not None:
                os.close(fd)  # releases the lock

    locked_compile_and_write._jss_once = True
    compiler._compile_and_write_cache = locked_compile_and_write


# ----------------------------------------------------------------- parallel runs
# The README's test command runs the suite on pytest-xdist workers (``-n auto``):
# most single-process tests use one core (tracing and XLA's compiler are single
# threaded), so a second worker runs the next test on the other core. The ranks of
# an ``mpiexec`` job started by a test are its own processes, whatever the worker.

#: Workers for ``-n auto``: one per core, at most 4 (each worker is a JAX process,
#: and the tests it starts bring up to 8 more: an 8-rank job, an 8-device process).
MAX_AUTO_WORKERS = 4


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config):
    return max(1, min(os.cpu_count() or 1, MAX_AUTO_WORKERS))


#: Tests that run for tens of seconds or minutes (each an ``mpiexec`` job or a
#: subprocess), with rough seconds on the quiet 2-core CI machine (the serial run
#: of docs/topics/test_suite.md, "The suite's time", the relative order confirmed
#: by a loaded parallel run); only their order matters. Under xdist they are
#: handed out first, longest first, two tests at a time (``maxschedchunk``), so
#: that no worker is left with a long test at the end while the other idles.
#: Node ids are matched by prefix.
LONG_TESTS = {
    "tests/test_axis_transport.py::test_axis_cases_on_eight_host_devices[axis_cases.py]": 150,
    "tests/test_multirank.py::test_mpi_suite[3]": 80,
    "tests/test_axis_transport.py::test_axis_cases_on_eight_host_devices[axis_oktopk": 75,
    "tests/test_axis_transport.py::test_axis_cases_on_eight_host_devices[axis_chunked": 25,
    "tests/test_multirank.py::test_mpi_suite[2]": 70,
    "tests/test_multirank.py::test_mpi_suite[4]": 50,
    "tests/test_multirank.py::test_mpi_suite[8]": 45,
    "tests/test_gpu_campaign.py": 34,
    "tests/test_axis_transport.py::test_two_processes_of_four_devices": 30,
    "tests/test_multirank.py::test_sparse_results_given_as_entries": 20,
    "tests/test_multirank.py::test_mpi_files_with_default_emitters": 20,
    "tests/test_device_protocol.py": 20,
    "tests/test_sharded_sync.py::test_mesh_axis_cases_on_four_host_devices": 25,
    "tests/test_sharded_sync.py::test_restore_with_orbax_at_two_four_and_three_ranks": 25,
    "tests/cuda_host/": 15,
    "tests/test_convergence_examples.py::test_train_resnet_two_ranks": 15,
    "tests/test_example.py::test_train_flax_two_ranks": 15,
    "tests/test_time_to_accuracy.py::test_worker_times_every_phase": 15,
    "tests/test_benchmark_smoke.py::test_shard_map_bench_smoke": 12,
    "tests/test_adam_direction_pass.py::test_mean_moment_averages_to_dense": 12,
    "tests/test_kernels.py::test_int64_offsets_at_the_largest_size": 10,
}


def _expected_seconds(nodeid: str) -> float:
    return max((s for prefix, s in LONG_TESTS.items() if nodeid.startswith(prefix)), default=0.0)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_setupnodes(config, specs):
    # xdist's load scheduler first hands each worker a quarter of its share of the
    # tests in one consecutive chunk: all the long tests would go to the first
    # worker. Two at a time (the least it sends) keeps the long-first order.
    if getattr(config.option, "maxschedchunk", 0) is None:
        config.option.maxschedchunk = 2


def pytest_collection_modifyitems(config, items):
    """On an xdist worker: the long tests first, longest first (a stable sort, so
    everything else keeps its order; every worker sorts alike, as xdist requires)."""
    if hasattr(config, "workerinput"):
        items.sort(key=lambda item: -_expected_seconds(item.nodeid))

