"""Layer 1, the store: the Redis a client talks to and what it knows about it. URLs and the one
connection factory, the embedded default server, the script runner (the only caller of Lua), the
namespace epoch and witness, and the replication lineage."""
