"""HTML for the widget's doctor parts: each rank's stacks and the silent-ranks warning."""

from __future__ import annotations

import html
import time

from serverless_gpu.events import RanksSilent
from serverless_gpu.hangs import warning_text
from serverless_gpu.stack_text import where

_PRE = "margin:0;white-space:pre;overflow-x:auto;font-size:12px;line-height:1.35"


def stacks_html(rank: int, text: str | None, taken: float) -> str:
    """One rank's stacks, as the Stacks button took them (``None``: the rank did not answer)."""
    at = time.strftime("%H:%M:%S", time.localtime(taken))
    if text is None:
        return (
            f'<div class="sgpu-stacks" data-rank="{rank}" style="color:#6e7781">stacks at {at}: '
            f"rank {rank} did not answer (it has ended, or has not started its function)</div>"
        )
    return (
        f'<details class="sgpu-stacks" data-rank="{rank}" open style="margin-bottom:6px">'
        f"<summary>stacks at {at} &middot; main thread in <code>{html.escape(where(text))}</code>"
        f'</summary><pre style="{_PRE}">{html.escape(text)}</pre></details>'
    )


def silent_html(event: RanksSilent) -> str:
    """The hang warning under the header; empty once the ranks show life again."""
    if not event.ranks:
        return ""
    return (
        '<div class="sgpu-hang" style="background:#fff8c5;border:1px solid #d4a72c;'
        'border-radius:4px;padding:2px 8px;margin:2px 0">&#9888; '
        f"{html.escape(warning_text(event))}: click <b>Stacks</b>.</div>"
    )
