"""`tepo report`: tables (terminal, Markdown, CSV) and plots over the runs of a sweep."""

from tepo_cli.eval.report.build import Report, build_report
from tepo_cli.eval.report.rows import Options

__all__ = ["Options", "Report", "build_report"]
