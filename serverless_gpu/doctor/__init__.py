"""The hang doctor's shared parts: stack signals and files, the flight recorder, reading stacks."""
