"""Layer 3, policy: failure classes and the retry decision, idempotent side effects, reconciliation
of suspect Attempts, and recovery after a state loss."""
