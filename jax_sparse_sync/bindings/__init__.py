"""The XLA FFI kernels as JAX functions: selection, QSGD compression, block scan.

Per-device computation only (no communication): both transports and the
transforms build on them. The public ones are exported as ``jss.topk``, ...
"""
