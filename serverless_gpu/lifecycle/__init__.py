"""One run's lifecycle without I/O, shared by every backend (``run_machine``): the launcher's
supervisor and the Ray backend's run translate their transport into its inputs and its actions
(``run_actions``) into their transport. No clocks, threads, sockets or processes here."""
