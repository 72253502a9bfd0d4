"""configs/grafana/vllm-probe.json against the fields of Grafana's dashboard JSON model it
uses (the classic model: grafana.com/docs/grafana/latest/dashboards/build-dashboards/
view-dashboard-json-model/), and its queries against the metrics that exist.

That every query runs on a real Prometheus and returns data: tests/e2e/test_fleet_prometheus.py.
"""

from __future__ import annotations

import json
import re

import pytest

from tests.conftest import ROOT

DASHBOARD = ROOT / "configs" / "grafana" / "vllm-probe.json"
PANEL_TYPES = {"row", "timeseries", "stat", "table"}
UNITS = {"short", "percentunit", "s"}
#: Variables Grafana defines itself, and the dashboard's own.
BUILTIN_VARS = {"__rate_interval", "__interval", "__range"}
#: Grafana's variable syntaxes: $name, ${name}, ${name:format}, [[name]].
VAR_RE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)|\[\[(\w+)\]\]")
METRIC_RE = re.compile(r"\bvllm_probe_\w+")


@pytest.fixture(scope="module")
def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def documented_metrics() -> set[str]:
    return set(re.findall(r"^\| `(vllm_probe_\w+)`", (ROOT / "docs" / "metrics.md").read_text(), re.M))


def queries(dashboard: dict) -> list[tuple[str, str]]:
    """(panel title, expr) of every target."""
    return [(p["title"], t["expr"]) for p in dashboard["panels"] for t in p.get("targets", [])]


def test_top_level_fields(dashboard):
    assert isinstance(dashboard["title"], str) and dashboard["title"]
    assert re.fullmatch(r"[A-Za-z0-9_-]{1,40}", dashboard["uid"])
    assert dashboard["id"] is None  # assigned by Grafana when saved
    assert isinstance(dashboard["schemaVersion"], int) and dashboard["schemaVersion"] >= 36
    assert isinstance(dashboard["version"], int)
    assert dashboard["time"] == {"from": "now-1h", "to": "now"}
    assert isinstance(dashboard["refresh"], str) and re.fullmatch(r"\d+[smh]", dashboard["refresh"])
    assert isinstance(dashboard["tags"], list) and all(isinstance(t, str) for t in dashboard["tags"])
    assert dashboard["timezone"] in ("browser", "utc", "")
    assert dashboard["graphTooltip"] in (0, 1, 2)
    assert isinstance(dashboard["editable"], bool)
    assert dashboard["annotations"] == {"list": []} and dashboard["links"] == []
    # importable: the data source is an input chosen at import time
    (inp,) = dashboard["__inputs"]
    assert inp["type"] == "datasource" and inp["pluginId"] == "prometheus"
    required = {(r["type"], r["id"]) for r in dashboard["__requires"]}
    used = {("panel", p["type"]) for p in dashboard["panels"] if p["type"] != "row"}
    assert used <= required and ("datasource", "prometheus") in required


def test_variables(dashboard):
    variables = dashboard["templating"]["list"]
    names = [v["name"] for v in variables]
    assert len(names) == len(set(names))
    assert names == ["datasource", "model_name", "instance", "engine"]
    ds = variables[0]
    assert ds["type"] == "datasource" and ds["query"] == "prometheus"
    assert ds["current"]["value"] == "${" + dashboard["__inputs"][0]["name"] + "}"
    for v in variables[1:]:
        assert v["type"] == "query" and v["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert v["query"]["query"] == v["definition"] and v["definition"].startswith("label_values(")
        assert v["includeAll"] is True and v["allValue"] in (".*", ".+")
        assert v["refresh"] in (1, 2) and isinstance(v["multi"], bool)
        # a variable may only refer to the ones before it
        refs = {a or b or c for a, b, c in VAR_RE.findall(v["definition"])}
        assert refs <= set(names[: names.index(v["name"])]), (v["name"], refs)
    # model_name may be absent from every series: its "All" must match the empty value
    assert variables[1]["allValue"] == ".*"


def test_panels_grid_and_targets(dashboard):
    panels = dashboard["panels"]
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)) and all(isinstance(i, int) for i in ids)
    cells: set[tuple[int, int]] = set()
    for p in panels:
        assert p["type"] in PANEL_TYPES, p["type"]
        assert isinstance(p["title"], str) and p["title"]
        g = p["gridPos"]
        assert set(g) == {"h", "w", "x", "y"} and all(isinstance(v, int) and v >= 0 for v in g.values())
        assert g["w"] >= 1 and g["h"] >= 1 and g["x"] + g["w"] <= 24, p["title"]
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not mine & cells, f"{p['title']} overlaps another panel"
        cells |= mine
        if p["type"] == "row":
            assert p["collapsed"] is False and p["panels"] == [] and g["w"] == 24 and g["h"] == 1
            continue
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert isinstance(p["description"], str) and p["description"]
        assert p["fieldConfig"]["defaults"]["unit"] in UNITS and p["fieldConfig"]["overrides"] == []
        refs = [t["refId"] for t in p["targets"]]
        assert p["targets"] and len(refs) == len(set(refs))
        for t in p["targets"]:
            assert t["datasource"] == p["datasource"]
            assert isinstance(t["expr"], str) and t["expr"].count("(") == t["expr"].count(")")
            assert isinstance(t["legendFormat"], str)
            assert t["instant"] != t["range"]
        if p["type"] == "timeseries":
            assert p["fieldConfig"]["defaults"]["custom"]["stacking"]["mode"] in ("none", "normal")
            assert p["options"]["legend"]["placement"] == "bottom"
        if p["type"] == "table":
            assert all(t["format"] == "table" and t["instant"] for t in p["targets"])


def test_queries_use_only_metrics_that_exist_and_defined_variables(dashboard):
    documented = documented_metrics()
    histograms = {m for m in documented if not m.endswith(("_total", "_info"))}
    variables = {v["name"] for v in dashboard["templating"]["list"]} | BUILTIN_VARS
    for title, expr in queries(dashboard):
        for name in METRIC_RE.findall(expr):
            base = re.sub(r"_(bucket|sum|count)$", "", name)
            assert name in documented or base in histograms, (title, name)
        refs = {a or b or c for a, b, c in VAR_RE.findall(expr)}
        assert refs <= variables, (title, refs - variables)
        if "vllm_probe_lines_skipped_total" not in expr:  # the reader's series carry no engine
            assert 'engine=~"$engine"' in expr, (title, expr)


def test_it_draws_what_the_issue_asks_for(dashboard):
    """Budget use, prefill/decode split, preemptions and discarded tokens, head-blocked
    reasons, TTFT and queue time, KV, findings; per engine and across the fleet."""
    used = {m for _, expr in queries(dashboard) for m in METRIC_RE.findall(expr)}
    for metric in ("vllm_probe_step_budget_use_ratio_bucket", "vllm_probe_prefill_tokens_total",
                   "vllm_probe_decode_tokens_total", "vllm_probe_preemptions_total",
                   "vllm_probe_discarded_tokens_total", "vllm_probe_steps_by_head_blocked_total",
                   "vllm_probe_time_to_first_token_seconds_bucket", "vllm_probe_request_queue_time_seconds_bucket",
                   "vllm_probe_kv_cache_usage_ratio", "vllm_probe_finding", "vllm_probe_steps_by_limit_total"):
        assert metric in used, metric
    exprs = [expr for _, expr in queries(dashboard)]
    assert any("by (instance, engine" in e for e in exprs)  # per engine core of each replica
    assert any(e.startswith("sum(") or "sum by (le)" in e for e in exprs)  # across the fleet


def substitute(expr: str) -> str:
    """A dashboard query as Grafana sends it with every variable at "All"."""
    values = {"instance": ".+", "engine": ".+", "model_name": ".*", "__rate_interval": "1m", "__interval": "15s",
              "__range": "1h"}
    return VAR_RE.sub(lambda m: values[m.group(1) or m.group(2) or m.group(3)], expr)


def test_every_query_is_valid_promql(dashboard, tmp_path):
    """Each query, its variables substituted, as a recording rule checked by ``promtool``
    (from the same Debian package as Prometheus; .ci/run installs it)."""
    import shutil
    import subprocess

    promtool = shutil.which("promtool")
    if promtool is None:
        import os

        if os.environ.get("VLLMPROBE_TEST_REQUIRE_PROMETHEUS") == "1":
            pytest.fail("promtool is not installed (.ci/run installs Debian's prometheus package)")
        pytest.skip("promtool is not installed (apt-get install prometheus)")
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:query_{i}", "expr": substitute(expr)} for i, (_, expr) in enumerate(queries(dashboard))
    ]}]}
    path = tmp_path / "rules.yml"
    path.write_text(json.dumps(rules))  # JSON is YAML
    proc = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(queries(dashboard))} rules found" in proc.stdout + proc.stderr
