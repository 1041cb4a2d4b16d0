"""`accelbench report`: the bench results JSON rendered to HTML tables and PNG plots."""

from .render import render_report

__all__ = ["render_report"]
