"""The public API's implementation: the decorator, sweeps, scripts, waiting on many
runs, drop-ins."""
