"""A run's files: its private directory, the payload and results written and read there."""
