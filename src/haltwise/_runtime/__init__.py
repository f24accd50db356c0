"""The runtime: runs a task against the journal interface (checkpoints, policies in flight, replay,
deadlines, shielding, takeover, child runs, workers). Knows no store by name and no terminal."""
