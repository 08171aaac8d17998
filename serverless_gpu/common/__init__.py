"""Used by every process (caller, launcher, ranks): errors, settings, GPU detection,
process lifetime."""
