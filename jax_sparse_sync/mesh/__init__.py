"""The JAX-collective transport (``comm=jss.axis(name)``): one module per algorithm.

See :mod:`jax_sparse_sync.mesh.sparse_allreduce` for how each algorithm maps to collectives.
"""
