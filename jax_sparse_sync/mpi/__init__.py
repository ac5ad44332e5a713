"""The MPI transport: the ordered effect, ordered FFI primitives, communicators, one module per MPI op."""
