"""deploy/k8s/: the manifests parse, hang together, and say what kvrouterd and vLLM expect.

No cluster here: every YAML document must parse and be a Kubernetes object; every ConfigMap's
kvrouterd.conf must pass `kvrouterd -t` (the real binary; engine names that do not resolve
here are only warnings); Services must select some pod template, volumes name existing
ConfigMaps; and the vLLM --kv-events-config JSON must point where kvrouterd listens and bind
its replay ROUTER where kvrouterd's replay template dials (ports, topic kv@$(POD_IP)@...).
"""

import json
import os
import re

import pytest

from kvrharness import run_kvr

yaml = pytest.importorskip("yaml")

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "deploy", "k8s")
SHAPES = ("sidecar", "replicas")


def load(shape):
    docs = []
    d = os.path.join(ROOT, shape)
    for name in sorted(os.listdir(d)):
        if name.endswith(".yaml"):
            with open(os.path.join(d, name)) as f:
                docs += [x for x in yaml.safe_load_all(f) if x is not None]
    return docs


def of_kind(docs, kind):
    return [d for d in docs if d["kind"] == kind]


def pod_templates(docs):
    return [w for w in docs if w["kind"] in ("Deployment", "StatefulSet")]


def confs(docs):
    return {c["metadata"]["name"]: c["data"]["kvrouterd.conf"] for c in of_kind(docs, "ConfigMap")}


def ini_values(text, key):
    return [m.group(1).strip() for m in re.finditer(r"(?m)^\s*%s\s*=\s*(.+)$" % key, text)]


def kv_events(docs):
    """(container, parsed --kv-events-config) of every vLLM container."""
    out = []
    for w in pod_templates(docs):
        for c in w["spec"]["template"]["spec"]["containers"]:
            args = c.get("args", [])
            if "--kv-events-config" in args:
                out.append((c, json.loads(args[args.index("--kv-events-config") + 1])))
    return out


def port_of(endpoint):
    return int(endpoint.rsplit(":", 1)[1])


@pytest.mark.parametrize("shape", SHAPES)
def test_manifests_parse_and_hang_together(shape):
    docs = load(shape)
    assert docs
    for d in docs:
        assert d.get("apiVersion") and d.get("kind") and d["metadata"].get("name"), d
    cms = {c["metadata"]["name"] for c in of_kind(docs, "ConfigMap")}
    labels = []
    for w in pod_templates(docs):
        tmpl = w["spec"]["template"]
        sel = w["spec"]["selector"]["matchLabels"]
        assert all(tmpl["metadata"]["labels"].get(k) == v for k, v in sel.items()), w
        labels.append(tmpl["metadata"]["labels"])
        for v in tmpl["spec"].get("volumes", []):
            if "configMap" in v:
                assert v["configMap"]["name"] in cms, v
    for svc in of_kind(docs, "Service"):
        sel = svc["spec"]["selector"]
        assert any(all(l.get(k) == v for k, v in sel.items()) for l in labels), svc


@pytest.mark.parametrize("shape", SHAPES)
def test_configmaps_pass_kvrouterd_t(shape, tmp_path):
    for name, text in confs(load(shape)).items():
        path = tmp_path / (name + ".conf")
        path.write_text(text)
        res = run_kvr(["-t", "-c", str(path)])
        assert res.returncode == 0, (name, res.stderr)


@pytest.mark.parametrize("shape", SHAPES)
def test_vllm_flags(shape):
    docs = load(shape)
    engines = kv_events(docs)
    assert engines
    for c, cfg in engines:
        assert cfg["enable_kv_cache_events"] is True and cfg["publisher"] == "zmq"
        assert cfg["topic"].startswith("kv@$(POD_IP)@")
        env = {e["name"]: e for e in c.get("env", [])}
        assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
        assert cfg["replay_endpoint"].startswith("tcp://*:")


def test_replicas_shape_ports():
    docs = load("replicas")
    cm = confs(docs)
    primary, replica = cm["kvrouterd-primary"], cm["kvrouterd-replica"]
    (_, cfg), = kv_events(docs)
    # engines connect (no '*') to the primary's bound event port
    assert "*" not in cfg["endpoint"] and cfg["endpoint"].startswith("tcp://kvrouterd-primary:")
    binds = [port_of(b) for b in ini_values(primary, "bind")]
    assert port_of(cfg["endpoint"]) in binds
    # every kvrouterd dials the ROUTER where vLLM binds it: replay_endpoint's port + rank
    rport = port_of(cfg["replay_endpoint"])
    (tmpl,) = ini_values(primary, "bind_replay")
    assert tmpl == "tcp://{pod}:{%d+rank}" % rport
    (conn,) = ini_values(replica, "connect")
    fwd_ep, replay = conn.split()
    assert replay == "replay=" + tmpl
    # the replicas connect to the primary's forward port through its Service
    (fwd,) = ini_values(primary, "forward")
    assert fwd_ep == "tcp://kvrouterd-primary:%d" % port_of(fwd)
    svc = {s["metadata"]["name"]: s for s in of_kind(docs, "Service")}
    ports = {p["port"] for p in svc["kvrouterd-primary"]["spec"]["ports"]}
    assert port_of(fwd) in ports and port_of(cfg["endpoint"]) in ports
    assert ini_values(primary, "pod_must_match_peer") == ["on"]


def test_sidecar_shape_ports():
    docs = load("sidecar")
    (conf,) = confs(docs).values()
    (_, cfg), = kv_events(docs)
    (sts,) = of_kind(docs, "StatefulSet")
    n = sts["spec"]["replicas"]
    svc = sts["spec"]["serviceName"]
    lines = ini_values(conf, "connect")
    assert len(lines) == n  # one per engine (DP size 1)
    assert cfg["endpoint"].startswith("tcp://*:")  # the engine binds; kvrouterd dials
    for i, line in enumerate(lines):
        ep, replay = line.split()
        host = "%s-%d.%s" % (sts["metadata"]["name"], i, svc)
        assert ep == "tcp://%s:%d" % (host, port_of(cfg["endpoint"]))
        assert replay == "replay=tcp://%s:%d" % (host, port_of(cfg["replay_endpoint"]))


def test_replicas_shape_shares_decisions():
    """[route] peer_bind / peers: the primary and every replica of the StatefulSet publish
    their decisions on one port and subscribe to all the others by stable names."""
    docs = load("replicas")
    cm = confs(docs)
    primary, replica = cm["kvrouterd-primary"], cm["kvrouterd-replica"]
    (sts,) = [w for w in of_kind(docs, "StatefulSet") if w["metadata"]["name"] == "kvrouterd"]
    svc = {s["metadata"]["name"]: s for s in of_kind(docs, "Service")}
    peers_svc = svc[sts["spec"]["serviceName"]]
    assert peers_svc["spec"]["clusterIP"] == "None"  # headless: per-pod names
    (bind,) = ini_values(primary, "peer_bind")
    assert ini_values(replica, "peer_bind") == [bind]
    port = port_of(bind)
    assert port in {p["port"] for p in peers_svc["spec"]["ports"]}
    assert port in {p["port"] for p in svc["kvrouterd-primary"]["spec"]["ports"]}
    names = ["tcp://%s-%d.%s:%d" % (sts["metadata"]["name"], i, peers_svc["metadata"]["name"],
                                    port) for i in range(sts["spec"]["replicas"])]
    (pp,) = ini_values(primary, "peers")
    (rp,) = ini_values(replica, "peers")
    assert pp.split() == names
    assert rp.split() == ["tcp://kvrouterd-primary:%d" % port] + names
    for w in pod_templates(docs):
        if w["metadata"]["name"] in ("kvrouterd", "kvrouterd-primary"):
            (c,) = w["spec"]["template"]["spec"]["containers"]
            assert port in {p["containerPort"] for p in c["ports"]}
