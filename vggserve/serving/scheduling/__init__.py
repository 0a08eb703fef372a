"""Scheduling images onto devices, with no HTTP in it: the bounded batch queue and its errors, the device workers
(two batches in flight), decoding off the event loop (threads or processes), and the path of one request's images."""
