#!/usr/bin/env bash
# Sets up .venv with everything jax_sparse_sync needs and builds the extension.
#
#   bash scripts/setup.sh            # idempotent: reuses .venv when present
#
# Environment:
#   PYTHON              interpreter for the venv (default: python3)
#   JSS_MPI_C_COMPILER  build against another MPI (e.g. /usr/bin/mpicc) instead
#                       of the embedded MPI of the `mpich` wheel
#   JSS_CUDA=ON         also build the CUDA module _jss_cuda (needs nvcc on PATH),
#                       for GPU architectures 80;90 unless CUDAARCHS says otherwise
#                       (e.g. CUDAARCHS=90), and install JAX's CUDA plugin
#   JSS_JAX_CUDA        which one (default: cudaNN for nvcc's major version NN, with
#                       pip's CUDA libraries; e.g. cuda13-local to use a system CUDA)
#   JSS_MPI4JAX=ON      also build mpi4jax (optional, for tests/test_beside_mpi4jax.py)
#                       from source against the same MPI; CUDA_PATH, when set, is passed on
#   JSS_FUZZ=OFF        do not install the fuzzing toolchain: by default, as root with
#                       apt-get and no clang that links libFuzzer, Debian's clang-19 and
#                       libclang-rt-19-dev are installed (`bash scripts/fuzz.sh install`;
#                       10 s here with the packages in apt's cache) so that CI fuzzes
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}

if [ ! -x .venv/bin/python ]; then
  echo "[setup] creating .venv with $($PYTHON --version)"
  "$PYTHON" -m venv .venv
fi
export PATH="$PWD/.venv/bin:$PATH"
python -m pip install -q --upgrade pip
echo "[setup] installing dependencies (constraints.txt)"
python -m pip install -q -c constraints.txt \
  jax jaxlib optax flax mpich mpi4py numpy ml_dtypes scikit-learn matplotlib \
  pytest pytest-timeout pytest-xdist hypothesis nanobind scikit-build-core cmake ninja
if [ "${JSS_CUDA:-OFF}" = "ON" ]; then
  if ! command -v nvcc >/dev/null 2>&1; then
    echo "[setup] JSS_CUDA=ON needs the CUDA toolkit's nvcc on PATH" >&2
    exit 1
  fi
  cuda_major=$(nvcc --version | sed -n 's/.*release \([0-9]*\)\..*/\1/p')
  JSS_JAX_CUDA=${JSS_JAX_CUDA:-cuda$cuda_major}
  echo "[setup] installing JAX's CUDA plugin: jax[$JSS_JAX_CUDA] (nvcc $cuda_major)"
  python -m pip install -q -c constraints.txt "jax[$JSS_JAX_CUDA]"
fi
# --no-build-isolation: the FFI handlers must be compiled against the jaxlib
# installed above (XLA FFI API skew breaks handlers built against another).
echo "[setup] building jax_sparse_sync"
python -m pip install -q --no-build-isolation --no-deps -e .
if [ "${JSS_MPI4JAX:-OFF}" = "ON" ]; then
  # mpi4jax has no wheel: built here against the mpi4py (and so the MPI) installed above
  echo "[setup] building mpi4jax against $(python -c 'from mpi4py import MPI; print(MPI.Get_library_version().splitlines()[0])')"
  python -m pip install -q -c constraints.txt cython wheel
  python -m pip install -q -c constraints.txt --no-build-isolation mpi4jax
fi
python -c "import jax_sparse_sync as jss; print('[setup] jax_sparse_sync', jss.__version__, 'ready;',
  'CUDA module:', 'yes' if jss._ext.cuda_available() else 'no (build with JSS_CUDA=ON)')"
if [ "${JSS_FUZZ:-ON}" != "OFF" ]; then
  # the C++ collectives' fuzz targets (scripts/fuzz.sh, run by .ci/run); a user without
  # root gets a note, not a failed setup: the library does not need clang
  bash scripts/fuzz.sh install || echo "[setup] fuzzing toolchain not installed (JSS_FUZZ=OFF skips this step)"
fi
if [ "${JSS_CUDA:-OFF}" = "ON" ]; then
  # asked for the CUDA module: fail here rather than on the first GPU call
  python -c "import jax_sparse_sync as jss, sys; sys.exit(0 if jss._ext.cuda_available() else
    '[setup] JSS_CUDA=ON but the CUDA module did not load; see the build output above')"
fi
