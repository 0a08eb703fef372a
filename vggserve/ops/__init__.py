"""Host-side operators: each owns its device data and enqueues its kernels (sparse ones so far; see docs/sparse.md)."""
