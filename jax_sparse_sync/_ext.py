"""Loads the compiled FFI modules and registers their targets with XLA.

The CPU module (``_jss_cpu``) is required. The CUDA module (``_jss_cuda``,
built with ``JSS_CUDA=ON bash scripts/setup.sh``) is optional: when present,
its handlers are registered for platform ``"CUDA"`` under the same target
names as the CPU ones, so every op runs on GPU arrays unchanged.

Every target name also gets a CUDA handler when the CUDA module does not
provide one: a stand-in from the CPU module that fails the call with a message
saying what to do (rebuild with the CUDA module, or run on CPU), instead of
XLA's "no registered implementation" for the custom call.
"""

from __future__ import annotations

import importlib
import importlib.util
import warnings

import jax

try:
    from jax_sparse_sync import _jss_cpu as cpu_module
except ImportError as e:  # pragma: no cover - only on a broken install
    raise ImportError(
        "jax_sparse_sync's compiled extension (_jss_cpu) is missing. Install the package with "
        "`pip install --no-build-isolation .` (the build needs jax, jaxlib, nanobind, "
        "scikit-build-core and an MPI: the `mpich` wheel by default)."
    ) from e

cuda_module = None  # without JSS_CUDA=ON: the normal CPU-only install
if importlib.util.find_spec("jax_sparse_sync._jss_cuda") is not None:
    try:
        cuda_module = importlib.import_module("jax_sparse_sync._jss_cuda")
    except ImportError as e:  # pragma: no cover - the module exists but cannot load
        warnings.warn(f"jax_sparse_sync: the CUDA module (_jss_cuda) failed to load ({e}); "
                      "GPU calls will fail. Rebuild with JSS_CUDA=ON bash scripts/setup.sh.",
                      RuntimeWarning, stacklevel=2)

#: XLA platform name under which the CUDA handlers are registered.
CUDA_PLATFORM = "CUDA"

#: Target names with a CPU handler.
CPU_TARGETS: tuple[str, ...] = tuple(sorted(cpu_module.registrations()))

#: CPU targets with no CUDA twin by design (their callers would run XLA's own fusion
#: on other platforms, so the CUDA stand-in is never reached): none since the
#: accumulator and Adam-direction passes (``jss_accumulate``, ``jss_accumulate_topk``,
#: ``jss_adam_direction``, ``jss_adam_accumulate``) got theirs; their callers still
#: keep an XLA twin for a build without it (:func:`kernel_platforms`).
CPU_ONLY_TARGETS: tuple[str, ...] = ()

for _name, _capsule in cpu_module.registrations().items():
    jax.ffi.register_ffi_target(_name, _capsule, platform="cpu")

#: How each target is served on CUDA: ``"cuda_module"`` (a real CUDA handler),
#: ``"module_missing"`` (stand-in: the CUDA module was not built) or
#: ``"no_cuda_implementation"`` (stand-in: the CUDA module has no such handler).
CUDA_REGISTRATIONS: dict[str, str] = {}


def _register_cuda_targets() -> None:
    cuda_handlers = dict(cuda_module.registrations()) if cuda_module is not None else {}
    stand_ins = cpu_module.cuda_fallback_handlers()
    for name in sorted(set(CPU_TARGETS) | set(cuda_handlers)):
        if name in cuda_handlers:
            kind, capsule = "cuda_module", cuda_handlers[name]
        elif cuda_module is None:
            kind, capsule = "module_missing", stand_ins["module_missing"]
        else:
            kind, capsule = "no_cuda_implementation", stand_ins["no_cuda_implementation"]
        # On a CPU-only jaxlib this only queues the target for a CUDA plugin.
        jax.ffi.register_ffi_target(name, capsule, platform=CUDA_PLATFORM)
        CUDA_REGISTRATIONS[name] = kind


_register_cuda_targets()


def cuda_available() -> bool:
    """Whether the CUDA module was built and loaded (GPU arrays run on their device).

    False means jax_sparse_sync ops on GPU arrays fail with a message to rebuild
    with ``JSS_CUDA=ON bash scripts/setup.sh``; CPU arrays work either way.
    Whether a GPU is present is JAX's business (``jax.default_backend()``).

    Returns:
      True when ``_jss_cuda`` was imported.

    Example:
      >>> from jax_sparse_sync import _ext
      >>> _ext.cuda_available() == (_ext.cuda_module is not None)
      True
    """
    return cuda_module is not None


def cuda_targets() -> tuple[str, ...]:
    """FFI target names that have a real CUDA handler (empty without the CUDA module).

    Returns:
      Sorted target names, e.g. ``("jss_block_allreduce", ..., "jss_topk")``.

    Example:
      >>> from jax_sparse_sync import _ext
      >>> set(_ext.cuda_targets()) <= set(_ext.CUDA_REGISTRATIONS)
      True
    """
    return tuple(sorted(n for n, kind in CUDA_REGISTRATIONS.items() if kind == "cuda_module"))


def kernel_platforms(name: str) -> tuple[str, ...]:
    """The ``jax.lax.platform_dependent`` platforms on which target ``name`` runs as
    this library's kernel: ``"cpu"``, and ``"cuda"`` where the CUDA module serves it.

    A caller with an XLA twin of a kernel (the accumulator and Adam-direction
    passes) takes the kernel there and the twin elsewhere, so a GPU build without
    the kernel's CUDA source still runs (through XLA) instead of failing in the
    stand-in.

    Returns:
      ``("cpu",)`` or ``("cpu", "cuda")``.

    Example:
      >>> from jax_sparse_sync import _ext
      >>> _ext.kernel_platforms("jss_topk")[0]
      'cpu'
    """
    return ("cpu", "cuda") if CUDA_REGISTRATIONS.get(name) == "cuda_module" else ("cpu",)


#: Algorithm name -> id understood by the C++ handlers (the enum lives in C++).
ALGORITHM_IDS: dict[str, int] = dict(cpu_module.algorithm_ids())
