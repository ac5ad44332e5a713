"""Module paths of 0.1 that moved, aliased for one release with a ``DeprecationWarning``.

- ``jax_sparse_sync.kernels.*`` is ``jax_sparse_sync.bindings.*`` (every ``ffi_call``
  of the package; renamed so it is not confused with the C++ ``kernels/`` folder);
- ``jax_sparse_sync.axis.*`` is ``jax_sparse_sync.mesh.*`` (the mesh-axis transport;
  renamed so that the subpackage no longer shadows the function ``jss.axis(name)``).

``import jax_sparse_sync.axis.comm`` and ``from jax_sparse_sync.kernels.selection import
topk`` still work (warning once per module). The old ``jax_sparse_sync.axis`` module is a
callable alias, so ``jss.axis("data")`` keeps naming a mesh axis even after an old-style
import rebinds the package attribute.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import types
import warnings

#: old package -> new package
MOVED = {"jax_sparse_sync.kernels": "jax_sparse_sync.bindings",
         "jax_sparse_sync.axis": "jax_sparse_sync.mesh"}


class _CallableAlias(types.ModuleType):
    """The old ``jax_sparse_sync.axis`` package: its attributes are ``jax_sparse_sync.mesh``'s,
    and calling it is ``jss.axis(name)``."""

    def __call__(self, *args, **kwargs):
        return importlib.import_module("jax_sparse_sync.mesh.comm").axis(*args, **kwargs)


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, old: str, new: str):
        self.old, self.new = old, new

    def create_module(self, spec):
        target = importlib.import_module(self.new)
        if self.old in MOVED:  # a package: an alias module reading the new one's attributes
            alias = (_CallableAlias if self.old == "jax_sparse_sync.axis" else types.ModuleType)(
                self.old, target.__doc__)
            alias.__path__ = []  # a package, so `import old.sub` is asked of the finder
            alias.__getattr__ = lambda name: getattr(target, name)
            return alias
        return target  # a module: the new module itself

    def exec_module(self, module):
        warnings.warn(f"{self.old} is deprecated and will be removed in the next release; "
                      f"import {self.new}", DeprecationWarning, stacklevel=2)


class _AliasFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        for old, new in MOVED.items():
            if fullname == old or fullname.startswith(old + "."):
                new_name = new + fullname[len(old):]
                if importlib.util.find_spec(new_name) is None:
                    return None
                return importlib.util.spec_from_loader(
                    fullname, _AliasLoader(fullname, new_name), is_package=fullname in MOVED)
        return None


def install() -> None:
    """Put the alias finder on ``sys.meta_path`` (once)."""
    if not any(isinstance(f, _AliasFinder) for f in sys.meta_path):
        sys.meta_path.append(_AliasFinder())
