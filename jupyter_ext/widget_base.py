"""The run widget's container and its teardown, shared by a run's widget and the runs table."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ipywidgets as widgets


class RunWidget(widgets.VBox):
    """A VBox whose ``text/plain`` form is the run's readable summary (text-only clients)."""

    def __init__(self, text: Callable[[], str], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._text = text

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any] | None:
        bundle: dict[str, Any] | None = super()._repr_mimebundle_(**kwargs)
        if bundle is not None:
            bundle["text/plain"] = self._text()
        return bundle


def _close(widget: widgets.Widget) -> None:
    """Close ``widget`` and every widget under it (their comms and kernel-side state)."""
    for child in getattr(widget, "children", ()):
        _close(child)
    widget.close()
