"""A fresh server exports, at 0, every series the dashboard (deploy/grafana/strata.json) and the alert rules
(deploy/prometheus/rules.yml) read: each status code strata returns under strata_requests_total, each
stage's strata_engine_errors_total and strata_nonfinite_logits_total. Prometheus' rate() and increase()
ignore a series' first sample, so a counter born at 1 on the first failure never fires StrataEngineErrors
and the panels say "No data" (the binary before created these series at the first event)."""

from __future__ import annotations

import re
import urllib.request

import generate_helpers as GH
import integration_helpers as IH

DASHBOARD = IH.REPO / "deploy" / "grafana" / "strata.json"
RULES = IH.REPO / "deploy" / "prometheus" / "rules.yml"
# The codes strata's Generate ends with (server/README.md, "Metrics").
CODES = ["OK", "CANCELLED", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
         "UNAVAILABLE", "INTERNAL", "UNAUTHENTICATED"]
# Documented as absent with --max-memory (the budgets did not come from the machine's inventory), which the
# two-stage logical plan needs.
ABSENT_WITH_MAX_MEMORY = {"strata_device_inventory_free_bytes"}


def test_a_fresh_server_exports_every_series_the_dashboard_and_the_alerts_read(server_factory, text_model):
    directory, _ = text_model
    server = server_factory(["--model", str(directory), *GH.TWO_STAGE_FLAGS])
    text = urllib.request.urlopen(server.metrics_url, timeout=10).read().decode()
    samples = {line.split(" ")[0]: float(line.split(" ")[1]) for line in text.splitlines()
               if line and not line.startswith("#")}
    exported = {re.sub(r"\{.*", "", name) for name in samples}

    read = set(re.findall(r"\bstrata_[a-z_]+", DASHBOARD.read_text() + RULES.read_text()))
    assert read, "no series found in the dashboard and the rules"
    missing = sorted(read - exported - ABSENT_WITH_MAX_MEMORY)
    assert not missing, f"read by the dashboard or the rules but not exported by a fresh server: {missing}"

    for api in ("grpc", "http"):
        for code in CODES:
            assert samples.get(f'strata_requests_total{{api="{api}",code="{code}"}}') == 0, (api, code)
        for histogram in ("request_duration", "time_to_first_token", "inter_token_latency"):
            assert samples.get(f'strata_{histogram}_seconds_count{{api="{api}"}}') == 0, (api, histogram)
    for family in ("strata_engine_errors_total", "strata_nonfinite_logits_total"):
        for stage in ("0", "1"):
            assert samples.get(f'{family}{{device="{stage}",stage="{stage}"}}') == 0, (family, stage, text)
    assert samples.get("strata_requests_failed_in_a_row") == 0
    assert samples.get("strata_serving") == 1
    assert server.stop() == 0
