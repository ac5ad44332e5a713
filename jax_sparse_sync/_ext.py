"""Loads the compiled FFI module and registers its targets with XLA.

The CPU module is required; a CUDA module (built with ``JSS_CUDA=ON``) is
optional and its absence is only reported when a CUDA call needs it.
"""

from __future__ import annotations

import jax

try:
    from jax_sparse_sync import _jss_cpu as cpu_module
except ImportError as e:  # pragma: no cover - only on a broken install
    raise ImportError(
        "jax_sparse_sync's compiled extension (_jss_cpu) is missing. Install the package with "
        "`pip install --no-build-isolation .` (the build needs jax, jaxlib, nanobind, "
        "scikit-build-core and an MPI: the `mpich` wheel by default)."
    ) from e

for _name, _capsule in cpu_module.registrations().items():
    jax.ffi.register_ffi_target(_name, _capsule, platform="cpu")

#: Algorithm name -> id understood by the C++ handlers (the enum lives in C++).
ALGORITHM_IDS: dict[str, int] = dict(cpu_module.algorithm_ids())
