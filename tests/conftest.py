import os
import shutil
import sys
import tempfile

# tests import the shared NumPy reference as `reference`
sys.path.insert(0, os.path.dirname(__file__))


def pytest_configure(config):
    """One JAX compilation cache for the whole session, subprocesses included.

    Most of the suite's time is XLA compiling the same programs again: every rank
    of every ``mpiexec`` job (tests/test_multirank.py runs tests/mpi at 2, 3, 4, 5
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
