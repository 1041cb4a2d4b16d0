"""The one error the renderer raises."""

from __future__ import annotations


class RenderError(ValueError):
    """A spec the renderer cannot turn into objects that would run; the message says what would.

    A ValueError like PlanError, so the controller maps both onto an InvalidSpec condition
    instead of creating children that fail after an expensive node has started.
    """
