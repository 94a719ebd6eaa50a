"""The deployment files: Kubernetes manifests valid against the Kubernetes API's schemas, the
replicas' Deployment leaving gracefully, the HAProxy configs accepted by HAProxy, and the compose
file of replicas naming files and secrets that exist.

Given the manifests under deploy/kubernetes/, each object is checked strictly (no unknown field)
with `kubernetes-validate`, which ships the Kubernetes JSON schemas; the example configs inside
the ConfigMaps are checked by test_config_reference.py.
"""

from __future__ import annotations

import copy
import re
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from tests.support.haproxy import haproxy_binary

ROOT = Path(__file__).resolve().parents[2]
KUBERNETES = ROOT / "deploy" / "kubernetes"
KUBERNETES_VERSION = "1.30.0"  # the oldest the manifests are for: preStop `sleep` and appArmorProfile are 1.30


def documents(path: Path) -> list[dict[str, Any]]:
    return [document for document in yaml.safe_load_all(path.read_text()) if document]


MANIFESTS = [(path, document) for path in sorted(KUBERNETES.glob("*.yaml")) for document in documents(path)]


def one(kind: str, name: str) -> dict[str, Any]:
    return next(d for _, d in MANIFESTS if d["kind"] == kind and d["metadata"]["name"] == name)


@pytest.mark.parametrize("version", [KUBERNETES_VERSION, kubernetes_validate.latest_version()])
@pytest.mark.parametrize(
    ("path", "document"), MANIFESTS, ids=[f"{p.name}:{d['kind']}:{d['metadata']['name']}" for p, d in MANIFESTS]
)
def test_every_manifest_is_valid_for_kubernetes(path: Path, document: dict[str, Any], version: str) -> None:
    kubernetes_validate.validate(document, version, strict=True)


def test_the_validator_refuses_a_misspelt_field() -> None:
    deployment = copy.deepcopy(one("Deployment", "mcpvisor-replicas"))
    deployment["spec"]["template"]["spec"]["containers"][0]["readinessprobe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSION, strict=True)


def replica_config() -> dict[str, Any]:
    return tomllib.loads(one("ConfigMap", "mcpvisor-replicas-config")["data"]["mcpvisor.toml"])


def test_the_replicas_deployment_runs_three_pods_that_leave_gracefully() -> None:
    deployment = one("Deployment", "mcpvisor-replicas")
    spec = deployment["spec"]
    assert spec["replicas"] == 3 and spec["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    pod = spec["template"]["spec"]
    container = pod["containers"][0]
    labels = spec["template"]["metadata"]["labels"]
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        assert container[probe]["httpGet"]["path"] == "/healthz"
    assert container["resources"]["requests"]["cpu"] and container["resources"]["requests"]["memory"]
    # Long enough for the whole leave: preStop, leave_delay, leave_timeout, the workers' stop.
    settings = replica_config()["mcpvisor"]
    pre_stop = container["lifecycle"]["preStop"]["sleep"]["seconds"]
    assert pod["terminationGracePeriodSeconds"] >= pre_stop + settings["leave_delay"] + settings["leave_timeout"] + 10
    # A leaving pod (503 on /healthz) is taken out of rotation at its next readiness probe, and is
    # not restarted by its liveness probe before it has left.
    readiness, liveness = container["readinessProbe"], container["livenessProbe"]
    assert readiness["failureThreshold"] * readiness["periodSeconds"] <= settings["leave_delay"]
    assert liveness["failureThreshold"] * liveness["periodSeconds"] > pod["terminationGracePeriodSeconds"]
    # The PodDisruptionBudget, the Services and the HPA all find these pods.
    budget = one("PodDisruptionBudget", "mcpvisor-replicas")
    assert budget["spec"]["selector"]["matchLabels"].items() <= labels.items()
    for service in ("mcpvisor-replicas", "mcpvisor-replicas-pods"):
        assert one("Service", service)["spec"]["selector"].items() <= labels.items()
    target = one("HorizontalPodAutoscaler", "mcpvisor-replicas")["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", "mcpvisor-replicas")
    assert one("HorizontalPodAutoscaler", "mcpvisor-replicas")["spec"]["minReplicas"] >= 2


def test_the_replicas_share_postgresql_with_its_password_from_the_secret() -> None:
    settings = replica_config()["mcpvisor"]
    assert settings["state_url"].startswith("postgresql://")
    pod = one("Deployment", "mcpvisor-replicas")["spec"]["template"]["spec"]
    volume = next(v for v in pod["volumes"] if v.get("secret"))
    mount = next(m for m in pod["containers"][0]["volumeMounts"] if m["name"] == volume["name"])
    secret = one("Secret", volume["secret"]["secretName"])
    # Every file the config names under the Secret's mount is one of the Secret's keys.
    text = one("ConfigMap", "mcpvisor-replicas-config")["data"]["mcpvisor.toml"]
    named = set(re.findall(re.escape(mount["mountPath"]) + r"/([\w.-]+)", text))
    assert "db_password" in named and named <= set(secret["stringData"])
    assert "${file:" + mount["mountPath"] + "/db_password}@" in settings["state_url"]
    # With a shared store the config is never written back: the ConfigMap is mounted read-only.
    config_mount = next(m for m in pod["containers"][0]["volumeMounts"] if m["mountPath"] == "/etc/mcpvisor")
    assert config_mount["readOnly"] is True


def test_ingress_nginx_keeps_a_session_on_its_pod_and_sends_the_rest_anywhere() -> None:
    ingress = one("Ingress", "mcpvisor-replicas")
    annotations = ingress["metadata"]["annotations"]
    key = annotations["nginx.ingress.kubernetes.io/upstream-hash-by"]
    # The key is declared by the map the file tells operators to add: session id, else request id.
    text = (KUBERNETES / "ingress-nginx.yaml").read_text()
    assert f"map $http_mcp_session_id {key}" in text and '""      $request_id;' in text
    assert "non_idempotent" not in annotations["nginx.ingress.kubernetes.io/proxy-next-upstream"]
    backend = ingress["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"]
    assert one("Service", backend["name"])


def haproxy_check(config: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "haproxy.cfg"
    path.write_text(config)
    return subprocess.run(
        [haproxy_binary(), "-c", "-f", str(path)], capture_output=True, text=True, timeout=30, check=False
    )


@pytest.mark.parametrize("where", ["deploy/haproxy/haproxy.cfg", "deploy/kubernetes/haproxy.yaml"])
def test_haproxy_accepts_the_shipped_configs(where: str, tmp_path: Path) -> None:
    path = ROOT / where
    config = path.read_text() if path.suffix == ".cfg" else one("ConfigMap", "mcpvisor-haproxy")["data"]["haproxy.cfg"]
    result = haproxy_check(config, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    for directive in ("stick match req.hdr(mcp-session-id)", "stick store-response res.hdr(mcp-session-id)"):
        assert directive in config
    assert "option httpchk GET /healthz" in config and "retry-on conn-failure 503" in config
    # A misspelt directive is refused: the check above is not a formality.
    assert haproxy_check(config.replace("stick match", "stik match"), tmp_path).returncode != 0


def test_the_compose_file_of_replicas_names_what_exists() -> None:
    path = ROOT / "deploy" / "container" / "compose.replicas.yaml"
    compose = yaml.safe_load(path.read_text())
    services = compose["services"]
    assert {"postgres", "replica1", "replica2", "haproxy"} <= set(services)
    for name, service in services.items():
        for volume in service.get("volumes", []):
            if volume["type"] == "bind":
                assert (path.parent / volume["source"]).exists(), f"{name} binds {volume['source']}"
    replica = services["replica1"]
    config = (path.parent / replica["volumes"][0]["source"]).read_text()
    assert replica["volumes"][0]["target"] == "/etc/mcpvisor/mcpvisor.toml"
    assert set(re.findall(r"/run/secrets/([\w.-]+)", config)) <= set(replica["secrets"])
    assert tomllib.loads(config)["mcpvisor"]["state_url"].startswith("postgresql://")
    # The HAProxy servers are the compose replicas.
    haproxy = (ROOT / "deploy" / "haproxy" / "haproxy.cfg").read_text()
    assert set(re.findall(r"^\s+server (\S+) (\S+):8080$", haproxy, re.M)) == {
        ("replica1", "replica1"),
        ("replica2", "replica2"),
    }
