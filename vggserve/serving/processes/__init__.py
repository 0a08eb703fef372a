"""The multi-process layout (`--http-workers N`): the engine process's supervisor of HTTP front-end processes, the
front-end process itself, and the link between them (messages over a Unix socket, pixels and tensors through
shared memory)."""
