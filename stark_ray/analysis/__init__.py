"""Analysis of finished (or running) runs: DuckDB views, the paper's metrics, a Markdown report with plots.

No Ray here: ``views`` reads the Parquet rows through :mod:`stark_ray.store.read`, ``metrics`` is pure,
``report`` and ``plots`` write files (matplotlib is imported only when plots are drawn).
"""

from stark_ray.analysis.report import write_report
from stark_ray.analysis.views import connect

__all__ = ["connect", "write_report"]
