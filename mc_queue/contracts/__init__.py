"""Layer 0, the contracts: Redis key names, the records (Task, Attempt, Event), errors and reply codes,
failure records, retry and budget configuration, the state table, the codec and fail points.

Nothing here talks to Redis; everything above builds on these names."""
