"""Layer 6, operations on the contracts: the sweeper (expiry, outbox, packing, retention), the
retention archive, Prometheus metrics, text rendering, and the web console."""
