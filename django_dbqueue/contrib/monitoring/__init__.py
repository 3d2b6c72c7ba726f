"""Ready-to-use monitoring over the Prometheus metrics (docs/observability.md#alerts-and-a-grafana-dashboard):
``alerts.yml`` (Prometheus alerting rules) and ``grafana-dashboard.json``. Data files only;
:data:`ALERTS` and :data:`DASHBOARD` are their paths in the installed package."""

from pathlib import Path

HERE = Path(__file__).resolve().parent
ALERTS = HERE / "alerts.yml"
DASHBOARD = HERE / "grafana-dashboard.json"
