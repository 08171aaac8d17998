"""Imported in the launcher by ``rank_teardown.py``: ranks forked from then on exit at once
after their call instead of shutting their process groups down first."""

from serverless_gpu.rank import warm_group

warm_group.finish = lambda: None
