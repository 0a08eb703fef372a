"""Plumbing between processes of one host: the shared-memory arena that decoded pixels (and tensors) cross
without pickling. Used by the service's front ends and the batch job's decode processes alike."""
