"""What runs in the caller's process, beside the handle: re-attaching to runs, the original
API's names for a run's status and details."""
