"""Code that runs inside a rank process: its main, the runtime helpers, stop requests,
the warm group."""
