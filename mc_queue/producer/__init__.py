"""Layer 4, the producer side: an App and its registered handlers, enqueue through them, and the
RQ transport that hands Attempts to workers (dispatch: record first, then send)."""
