"""Helpers for tests, demos and benchmarks, not used by the service itself: stand-in models with the engine's
interface (`models`), a server started as a child process (`servers`) and a decode task that replays one decode
(`decoding`)."""
