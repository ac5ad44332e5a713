"""The base layer: argument checks, bit casts and JAX-compatibility helpers.

Imports nothing else of the package (tests/test_package_layout.py ranks every
subpackage and checks that imports only point down), so every layer may use it.
"""
