"""A test-session directory shared by pytest-xdist workers (tests/conftest.py runs
the suite on several)."""

import fcntl
import os
import shutil
from pathlib import Path


def shared_directory(tmp_path_factory, name: str, produce) -> Path:
    """A directory that ``produce(path)`` fills once per test session.

    For an expensive module fixture (an ``mpiexec`` job's results, the GPU
    campaign's dry run) whose tests xdist may hand to several workers: the first
    worker to need it produces it under a lock, the others wait for it and read it.
    The workers' temporary directories share a parent; without xdist this is the
    session's own. A failed ``produce`` leaves nothing behind, so the next worker
    tries again (and reports the same failure on its own tests).
    """
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent
    path = root / name
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (path / ".complete").exists():
            shutil.rmtree(path, ignore_errors=True)
            path.mkdir()
            try:
                produce(path)
            except BaseException:
                shutil.rmtree(path, ignore_errors=True)
                raise
            (path / ".complete").touch()
    return path
