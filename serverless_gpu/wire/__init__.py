"""What travels between the caller, the launcher and the ranks: messages, events, a run's spec and
config, its environment and the names of its files. Plain data; no process role of its own."""
