"""User-callable ops: selection, compression, the allreduces; ``transport.py`` picks MPI or a mesh axis.

Subpackage ``__init__`` files import nothing (tests/test_package_layout.py checks it),
so importing one module never drags in its siblings.
"""
