"""Settings for the whole suite."""

from __future__ import annotations

import signal

# A shell without job control starts a background command (`bash scripts/test.sh &`) with SIGINT
# ignored, and every child inherits that: a caller the tests interrupt like a user's Ctrl-C
# would never see KeyboardInterrupt. With a handler here, children start with the default again.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
