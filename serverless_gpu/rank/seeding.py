"""Fresh randomness in every rank, as every process under ``torchrun`` has.

Ranks are forked from the launcher (or made ahead of the call as standby ranks), so without
this they would inherit the launcher's random generators: torch's CPU generator, and numpy's
global one where numpy was imported. ``torch.rand`` on CPU, ``torch.randperm``, shuffled
``DataLoader`` orders and CPU dropout masks would then be the same on every rank and repeat
from call to call. Python's ``random`` is reseeded by CPython itself after a fork.

The reseed happens when the rank receives its call, before any user code, so a user who seeds
(``torch.manual_seed(0)`` inside the function) still gets exactly that seed.
"""

from __future__ import annotations

import random
import sys


def reseed() -> None:
    """Seed torch (CPU and every CUDA device) and numpy's global generator from OS entropy."""
    torch = sys.modules.get("torch")
    if torch is not None:
        # Draws a non-deterministic seed and applies it to CUDA too (queued until CUDA is
        # initialised, applied at once in a standby rank that already holds a context).
        torch.seed()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()  # None: seeded from the OS entropy source
    random.seed()
