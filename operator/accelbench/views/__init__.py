"""What a user reads after the runs: finished resources side by side (`accelbench compare`) and an
InferenceBench's results, or a BenchCampaign's results document, as an HTML page with PNG plots
(`accelbench report`). Pure over dicts; the CLI does the I/O, and every $ figure comes from
accelbench.cost."""

from .bench_page import render_report
from .campaign_page import render_campaign_report
from .compare import as_records, compare, format_value

__all__ = ["as_records", "compare", "format_value", "render_campaign_report", "render_report"]
