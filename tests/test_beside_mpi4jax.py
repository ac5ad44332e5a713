"""mpi4jax's collectives and the syncs in the same jitted step, under ``mpiexec``.

Runs tests/mpi/beside_mpi4jax_case.py (``topk_sync``, the non-blocking
``sparse_allreduce_start``/``done`` pair and ``grouped_topk_sync``, each beside
``mpi4jax.allreduce``) at 2 and 4 ranks: no deadlock within the job's time
limit, replicas bitwise identical, the sums right. mpi4jax is optional (it
builds from source against the venv's MPICH: docs/topics/reliability.md,
"Beside mpi4jax"); without it the test is skipped.
"""

import pytest
from test_multirank import run_under_mpiexec

pytest.importorskip("mpi4jax", reason="mpi4jax is not installed (optional; see "
                    "docs/topics/reliability.md, 'Beside mpi4jax', to build it)")


@pytest.mark.parametrize("nranks", [2, 4])
def test_mpi4jax_allreduce_and_the_syncs_in_one_jitted_step(nranks):
    # -m mpi4py: a rank that fails ends the job instead of leaving the others waiting
    proc = run_under_mpiexec(nranks, ["-m", "mpi4py", "tests/mpi/beside_mpi4jax_case.py"],
                             timeout=300)
    tail = (proc.stdout + proc.stderr)[-6000:]
    assert proc.returncode == 0, tail
    assert "MPI4JAX OK" in proc.stdout, tail
