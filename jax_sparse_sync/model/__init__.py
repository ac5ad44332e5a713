"""The pure models: the alpha-beta cost model, the algorithm it picks, the layer-grouping planner.

Numbers in, numbers out: no MPI, no collectives, no transforms, so the ops and
transports below the transforms can consult them. Calibration and profiling,
which run the transforms, live above in :mod:`jax_sparse_sync.planning`.
"""
