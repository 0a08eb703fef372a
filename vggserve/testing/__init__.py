"""Helpers for tests, demos and benchmarks, not used by the service itself: stand-in models with the engine's
interface (`models`) and a server started as a child process (`servers`)."""
