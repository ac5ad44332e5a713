"""``benchmarks/step_time.py`` by concept: modes, models, worker, launch, report (see its
docstring). Imported with ``benchmarks/`` on ``sys.path``, as the benchmarks run."""
