"""The HTTP protocols the service speaks, each an adapter over `Service`: vggserve's own `/classify` (`classify`),
the Open Inference Protocol / KServe v2 (`v2`), and the health, metadata and metrics routes. Each maps the
scheduler's errors (`scheduling.errors`) to its own statuses and error shape."""
