"""The Helm chart (charts/egpu): with its default values it renders the objects that
`kubectl kustomize manifests/` renders, spec for spec (Helm's own labels aside), and each value
changes what it names and nothing else.

helm and kubectl come from the build cache (``make k8s``); the tests that run them are skipped
only while a binary is missing there.
"""

from __future__ import annotations

import copy
import os
import re
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from devcluster import build
from egpu.config import load_config

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "egpu"
MANIFESTS = REPO / "manifests"
MONITORING = MANIFESTS / "monitoring"
PROMETHEUS_OPERATOR = MONITORING / "prometheus-operator"
RELEASE = "egpu"
NAMESPACE = "egpu-system"
APP_VERSION = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
EGPU_IMAGE = f"ghcr.io/egpu/egpu:{APP_VERSION}"
SCHEDULER_IMAGE = f"ghcr.io/egpu/egpu-kube-scheduler:{APP_VERSION}"
# The labels a chart usually adds; the only difference allowed between helm and kustomize.
HELM_LABELS = frozenset({
    "helm.sh/chart",
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
})
# The containers that run the egpu image (object, container), with the default values.
EGPU_CONTAINERS = {
    (("Deployment", NAMESPACE, "egpu-webhook"), "webhook"),
    (("DaemonSet", NAMESPACE, "egpu-node-agent"), "install"),
    (("DaemonSet", NAMESPACE, "egpu-node-agent"), "agent"),
}

Key = tuple[str, str, str]  # kind, namespace ("" when cluster-scoped), name
Objects = dict[Key, dict[str, Any]]


# --- rendering ----------------------------------------------------------------------------------

def _binary(name: str) -> Path:
    path = build.binary_path(name)
    if not (path.is_file() and os.access(path, os.X_OK)):
        pytest.fail(f"{name} is not built yet ({path} is missing): `make k8s` builds it")
    return path


def _run(argv: list[str | Path], env: dict[str, str] | None = None) -> str:
    result = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=120,
                            cwd=REPO, env=env)
    assert result.returncode == 0, f"{' '.join(map(str, argv))} failed:\n{result.stderr}"
    return result.stdout


@pytest.fixture(scope="module")
def helm_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """helm's cache, config and data folders in a temporary folder, not the user's."""
    home = tmp_path_factory.mktemp("helm")
    return {**os.environ, "HELM_CACHE_HOME": str(home / "cache"),
            "HELM_CONFIG_HOME": str(home / "config"), "HELM_DATA_HOME": str(home / "data")}


@pytest.fixture(scope="module")
def helm(helm_env: dict[str, str]) -> Callable[..., Objects]:
    """helm(**values) -> the objects of `helm template egpu charts/egpu --namespace egpu-system`
    with each value set by --set (dotted names, as --set takes them), hooks left out (they are
    Helm's alone: manifests/ has no hooks); helm(_hooks="true", **values) -> the hooks only."""
    binary = _binary("helm")
    cache: dict[tuple[tuple[str, str], ...], Objects] = {}

    def render(_hooks: str = "", **values: str) -> Objects:
        key = tuple(sorted(values.items()))
        if key not in cache:
            argv: list[str | Path] = [binary, "template", RELEASE, CHART, "--namespace", NAMESPACE]
            for name, value in key:
                argv += ["--set", f"{name}={value}"]
            cache[key] = _objects(_run(argv, helm_env), "helm template")
        return copy.deepcopy({k: obj for k, obj in cache[key].items()
                              if (HOOK in (obj["metadata"].get("annotations") or {}))
                              == bool(_hooks)})

    return render


@pytest.fixture(scope="module")
def kustomize() -> Callable[[Path], Objects]:
    """kustomize(folder) -> the objects of `kubectl kustomize folder`."""
    binary = _binary("kubectl")
    cache: dict[Path, Objects] = {}

    def render(folder: Path) -> Objects:
        if folder not in cache:
            cache[folder] = _objects(_run([binary, "kustomize", folder]), f"kustomize {folder}")
        return copy.deepcopy(cache[folder])

    return render


def _objects(stream: str, source: str) -> Objects:
    objects: Objects = {}
    for obj in yaml.safe_load_all(stream):
        if not obj:
            continue
        meta = obj["metadata"]
        key = (obj["kind"], meta.get("namespace", ""), meta["name"])
        assert key not in objects, f"{source} renders {_name(key)} twice"
        objects[key] = obj
    return objects


def _name(key: Key) -> str:
    kind, namespace, name = key
    return f"{kind} {namespace}/{name}" if namespace else f"{kind} {name}"


# --- comparing ----------------------------------------------------------------------------------

CONFIG_CHECKSUM = "egpu.io/config-checksum"
HOOK = "helm.sh/hook"


def _normalized(obj: dict[str, Any]) -> dict[str, Any]:
    """Without Helm's labels (an emptied labels map is dropped), and with the YAML documents in
    ConfigMaps (keys *.yaml) parsed: they are compared as data, not as text."""
    obj = copy.deepcopy(obj)
    meta = obj["metadata"]
    labels = {k: v for k, v in (meta.get("labels") or {}).items() if k not in HELM_LABELS}
    meta.pop("labels", None)
    if labels:
        meta["labels"] = labels
    template = obj.get("spec", {}).get("template", {}).get("metadata", {})
    annotations = template.get("annotations") or {}
    annotations.pop(CONFIG_CHECKSUM, None)  # the chart's alone: it rolls a part on a new config
    if "annotations" in template and not annotations:
        del template["annotations"]
    if obj["kind"] == "ConfigMap":
        for key, text in (obj.get("data") or {}).items():
            if key.endswith((".yaml", ".yml")):
                obj["data"][key] = yaml.safe_load(text)
    return obj


def _path(path: str, key: object) -> str:
    if isinstance(key, str) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_-]*", key):
        return f"{path}.{key}" if path else key
    return f"{path}[{key!r}]"


def _differences(left: Any, right: Any, path: str, names: tuple[str, str]) -> Iterator[str]:
    a, b = names
    if isinstance(left, dict) and isinstance(right, dict):
        for key in sorted(set(left) | set(right), key=str):
            where = _path(path, key)
            if key not in right:
                yield f"{where}: only in {a} ({left[key]!r})"
            elif key not in left:
                yield f"{where}: only in {b} ({right[key]!r})"
            else:
                yield from _differences(left[key], right[key], where, names)
    elif isinstance(left, list) and isinstance(right, list):
        if len(left) != len(right):
            yield f"{path}: {len(left)} items in {a}, {len(right)} in {b}"
        for i, (x, y) in enumerate(zip(left, right, strict=False)):
            yield from _differences(x, y, f"{path}[{i}]", names)
    elif left != right or (type(left) is bool) != (type(right) is bool):
        yield f"{path}: {a} {left!r}, {b} {right!r}"


def _compare(left: Objects, right: Objects, names: tuple[str, str] = ("kustomize", "helm")
             ) -> list[str]:
    """Every difference between two renders, one line each, naming the object and the path."""
    a, b = names
    problems = [f"{_name(k)}: only in {a}" for k in sorted(left.keys() - right.keys())]
    problems += [f"{_name(k)}: only in {b}" for k in sorted(right.keys() - left.keys())]
    for key in sorted(left.keys() & right.keys()):
        problems += [f"{_name(key)}: {line}" for line in _differences(
            _normalized(left[key]), _normalized(right[key]), "", names)]
    return problems


def _assert_same(left: Objects, right: Objects, names: tuple[str, str] = ("kustomize", "helm")
                 ) -> None:
    problems = _compare(left, right, names)
    assert not problems, f"{names[0]} and {names[1]} differ:\n  " + "\n  ".join(problems)


def _containers(objects: Objects) -> Iterator[tuple[tuple[Key, str], dict[str, Any]]]:
    """((object, container name), container) for every container and init container."""
    for key, obj in objects.items():
        pod = obj.get("spec", {}).get("template", {}).get("spec", {})
        for container in pod.get("initContainers", []) + pod.get("containers", []):
            yield (key, container["name"]), container


# --- with the default values, the chart is manifests/ ------------------------------------------

def test_default_values_render_what_kustomize_renders(helm, kustomize) -> None:
    _assert_same(kustomize(MANIFESTS), helm())


def test_helm_labels_are_on_every_object(helm) -> None:
    for key, obj in helm().items():
        labels = obj["metadata"].get("labels") or {}
        assert labels.keys() >= HELM_LABELS, f"{_name(key)}: labels {sorted(labels)}"
        assert labels["app.kubernetes.io/instance"] == RELEASE


def test_prometheus_operator_objects_are_those_of_manifests(helm, kustomize) -> None:
    expected = kustomize(MANIFESTS) | kustomize(PROMETHEUS_OPERATOR)
    _assert_same(expected, helm(**{"monitoring.prometheusOperator.enabled": "true"}))


@pytest.mark.parametrize("extra", ["strict", "prometheus-operator"])
def test_helm_lint_strict_passes(helm_env, extra: str) -> None:
    argv: list[str | Path] = [_binary("helm"), "lint", "--strict", CHART]
    if extra == "prometheus-operator":
        argv += ["--set", "monitoring.prometheusOperator.enabled=true"]
    output = _run(argv, helm_env)
    assert "0 chart(s) failed" in output, output


# --- each value changes what it names, and nothing else -----------------------------------------

def test_the_egpu_containers_are_known(helm) -> None:
    running = {where for where, c in _containers(helm()) if c["image"] == EGPU_IMAGE}
    assert running >= EGPU_CONTAINERS, f"egpu image runs in {sorted(running)}"


@pytest.mark.parametrize(("values", "selects", "field", "value"), [
    pytest.param({"images.egpu.repository": "registry.example.com/team/egpu",
                  "images.egpu.tag": "9.9.9"},
                 lambda c: c["image"] == EGPU_IMAGE,
                 "image", "registry.example.com/team/egpu:9.9.9", id="egpu-image"),
    pytest.param({"images.egpu.pullPolicy": "Always"},
                 lambda c: c["image"] == EGPU_IMAGE,
                 "imagePullPolicy", "Always", id="egpu-pull-policy"),
    pytest.param({"images.scheduler.repository": "mirror.example.com/egpu-kube-scheduler",
                  "images.scheduler.tag": "0.1.1"},
                 lambda c: c["image"] == SCHEDULER_IMAGE,
                 "image", "mirror.example.com/egpu-kube-scheduler:0.1.1", id="scheduler-image"),
])
def test_an_image_value_changes_its_containers_and_nothing_else(
        helm, values: dict[str, str], selects: Callable[[dict[str, Any]], bool],
        field: str, value: str) -> None:
    default, changed = helm(), helm(**values)
    selected = {where for where, c in _containers(default) if selects(c)}
    assert selected, "no container runs that image with the default values"
    for where, container in _containers(changed):
        if where in selected:
            assert container.get(field) == value, f"{_name(where[0])} {where[1]}: {field}"
            # put the default back: what remains must be the default render
            before = dict(_containers(default))[where]
            if field in before:
                container[field] = before[field]
            else:
                del container[field]
    _assert_same(default, changed, ("default values", f"--set {values}"))


@pytest.mark.parametrize("extra", [
    pytest.param({}, id="default"),
    pytest.param({"monitoring.prometheusOperator.enabled": "true"}, id="prometheus-operator"),
])
def test_monitoring_off_drops_exactly_the_monitoring_objects(
        helm, kustomize, extra: dict[str, str]) -> None:
    monitoring = kustomize(MONITORING).keys() | kustomize(PROMETHEUS_OPERATOR).keys()
    on = helm(**extra)
    off = helm(**extra, **{"monitoring.enabled": "false"})
    dropped = on.keys() - off.keys()
    assert dropped, "monitoring.enabled=false dropped nothing"
    assert dropped == on.keys() & monitoring, f"dropped {sorted(map(_name, dropped))}"
    assert not off.keys() - on.keys()
    _assert_same({k: v for k, v in on.items() if k not in dropped}, off,
                 ("monitoring on", "monitoring off"))
    if extra:
        assert {kind for kind, _, _ in dropped} == {"ConfigMap", "PodMonitor", "PrometheusRule"}


def test_dra_enabled_renders_manifests_with_the_dra_component(
        helm, kustomize, tmp_path: Path) -> None:
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    base = os.path.relpath(MANIFESTS, overlay)  # kustomize takes relative paths only
    (overlay / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        f"resources: [{base}]\ncomponents: [{base}/dra]\n")
    on = helm(**{"dra.enabled": "true"})
    _assert_same(kustomize(overlay), on, ("kustomize + manifests/dra", "helm dra.enabled"))
    added = on.keys() - helm().keys()
    assert added == {("DeviceClass", "", "share.gpu.egpu.io"),
                     ("DeviceClass", "", "whole.gpu.egpu.io"),
                     ("ClusterRole", "", "egpu-webhook-claims"),
                     ("ClusterRoleBinding", "", "egpu-webhook-claims")}
    agent = dict(_containers(on))[(("DaemonSet", NAMESPACE, "egpu-node-agent"), "agent")]
    assert agent["args"] == ["--metrics-port=9400", "--dev-root=/host/dev", "--log-level=INFO",
                             "--dra", "--no-device-plugin"]
    # DRA mode's webhook creates and sweeps claims: its token is mounted only with DRA
    webhook = ("Deployment", NAMESPACE, "egpu-webhook")
    assert on[webhook]["spec"]["template"]["spec"]["automountServiceAccountToken"] is True
    assert helm()[webhook]["spec"]["template"]["spec"]["automountServiceAccountToken"] is False
    rules = on[("ClusterRole", "", "egpu-webhook-claims")]["rules"]
    assert {(r["resources"][0], tuple(r["verbs"])) for r in rules} == {
        ("resourceclaims", ("get", "list", "create", "delete")), ("pods", ("list",)),
        ("resourceslices", ("list",))}


def test_a_dra_node_pool_splits_the_agents_in_two_daemonsets(helm) -> None:
    """dra.nodeSelector: the pool's nodes run DRA only, the other GPU nodes the device plugin
    only (never both on one node: no card booked by both paths), each pool scraped."""
    on = helm(**{"dra.enabled": "true", "dra.nodeSelector.egpu\\.io/dra": "true",
                 "monitoring.prometheusOperator.enabled": "true"})
    plain = ("DaemonSet", NAMESPACE, "egpu-node-agent")
    pool = ("DaemonSet", NAMESPACE, "egpu-node-agent-dra")
    containers = dict(_containers(on))
    assert containers[(plain, "agent")]["args"] == ["--metrics-port=9400", "--dev-root=/host/dev",
                                                    "--log-level=INFO"]
    assert containers[(pool, "agent")]["args"] == [
        "--metrics-port=9400", "--dev-root=/host/dev", "--log-level=INFO", "--dra",
        "--no-device-plugin"]
    # a DRA agent's roll stops the old one first (both would serve the kubelet plugin's
    # sockets, each replacing the other's); the device plugin's surges (a socket per process)
    assert on[pool]["spec"]["updateStrategy"]["rollingUpdate"] == {"maxSurge": 0,
                                                                   "maxUnavailable": 1}
    assert on[plain]["spec"]["updateStrategy"]["rollingUpdate"] == {"maxSurge": 1,
                                                                    "maxUnavailable": 0}
    pool_spec = on[pool]["spec"]["template"]["spec"]
    assert pool_spec["nodeSelector"] == {"egpu.io/node": "true", "egpu.io/dra": "true"}
    assert {"name": "kubelet-plugins", "mountPath": "/var/lib/kubelet/plugins"} in (
        pool_spec["containers"][0]["volumeMounts"])
    plain_spec = on[plain]["spec"]["template"]["spec"]
    assert plain_spec["nodeSelector"] == {"egpu.io/node": "true"}
    assert plain_spec["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"] == [
        {"matchExpressions": [{"key": "egpu.io/dra", "operator": "NotIn", "values": ["true"]}]}]
    assert all(v["name"] != "kubelet-plugins" for v in plain_spec["volumes"])
    assert on[pool]["spec"]["selector"] != on[plain]["spec"]["selector"]  # no shared pods
    service = on[("Service", NAMESPACE, "egpu-node-agent-dra-metrics")]
    assert service["spec"]["selector"] == {"app.kubernetes.io/name": "egpu-node-agent-dra"}
    monitor = on[("PodMonitor", NAMESPACE, "egpu-node-agent")]["spec"]["selector"]
    assert monitor["matchExpressions"][0]["values"] == ["egpu-node-agent", "egpu-node-agent-dra"]


def test_webhook_values(helm) -> None:
    default = helm()
    changed = helm(**{"webhook.replicas": "3", "webhook.tls.secretName": "my-webhook-tls",
                      "webhook.caBundle": "Q0E="})
    deployment = changed[("Deployment", NAMESPACE, "egpu-webhook")]
    assert deployment["spec"]["replicas"] == 3
    volumes = deployment["spec"]["template"]["spec"]["volumes"]
    tls = next(v for v in volumes if v["name"] == "tls")
    assert tls["secret"]["secretName"] == "my-webhook-tls"
    hook = changed[("MutatingWebhookConfiguration", "", "egpu-webhook")]["webhooks"][0]
    assert hook["clientConfig"].pop("caBundle") == "Q0E="
    deployment["spec"]["replicas"] = 2
    tls["secret"]["secretName"] = "egpu-webhook-tls"
    _assert_same(default, changed, ("default values", "webhook values"))
    # one replica: no PodDisruptionBudget (minAvailable 1 would block every node drain)
    one = helm(**{"webhook.replicas": "1"})
    assert default.keys() - one.keys() == {("PodDisruptionBudget", NAMESPACE, "egpu-webhook")}


def test_namespace_values(helm) -> None:
    default = helm()
    moved = helm(**{"namespace.name": "gpu-share",
                    "config.ignoredNamespaces": "{kube-system,gpu-share}"})
    assert ("Namespace", "", "gpu-share") in moved
    for key in moved:
        assert key[1] in ("", "gpu-share", "kube-system"), _name(key)
    text = yaml.safe_dump_all(
        obj for key, obj in moved.items() if key != ("ConfigMap", "gpu-share", "egpu-config"))
    assert "egpu-system" not in text
    hook = moved[("MutatingWebhookConfiguration", "", "egpu-webhook")]["webhooks"][0]
    assert hook["clientConfig"]["service"]["namespace"] == "gpu-share"
    assert hook["namespaceSelector"]["matchExpressions"][0]["values"] == [
        "kube-system", "gpu-share"]
    kept = helm(**{"namespace.create": "false"})
    assert default.keys() - kept.keys() == {("Namespace", "", NAMESPACE)}
    assert not kept.keys() - default.keys()


def test_priority_class_values(helm) -> None:
    default = helm()
    none = helm(**{"priorityClasses.create": "false"})
    assert {k for k in default.keys() - none.keys()} == {
        ("PriorityClass", "", "egpu-online"), ("PriorityClass", "", "egpu-offline")}
    renamed = helm(**{"priorityClasses.online.name": "gpu-online",
                      "priorityClasses.online.value": "2000000"})
    online = renamed[("PriorityClass", "", "gpu-online")]
    assert online["value"] == 2000000 and "preemptionPolicy" not in online
    config = yaml.safe_load(renamed[("ConfigMap", NAMESPACE, "egpu-config")]["data"]["config.yaml"])
    # the created class maps to high; the configured names stay
    assert config["priorityClasses"] == {
        "gpu-online": "high", "egpu-online": "high", "egpu-offline": "low"}


def test_config_values(helm) -> None:
    changed = helm(**{"config.sharesPerCard": "4", "config.schedulerName": "gpu-share"})
    text = changed[("ConfigMap", NAMESPACE, "egpu-config")]["data"]["config.yaml"]
    config = load_config(text)  # what every egpu part reads
    assert config.shares_per_card == 4 and config.scheduler_name == "gpu-share"
    scheduler = yaml.safe_load(
        changed[("ConfigMap", NAMESPACE, "egpu-scheduler-config")]["data"]["config.yaml"])
    assert [p["schedulerName"] for p in scheduler["profiles"]] == ["gpu-share"]


def test_default_config_reads_as_the_manifests_config(helm, kustomize) -> None:
    key = ("ConfigMap", NAMESPACE, "egpu-config")
    assert load_config(helm()[key]["data"]["config.yaml"]) == load_config(
        kustomize(MANIFESTS)[key]["data"]["config.yaml"])


# --- without binaries: the chart's copies of manifests/ and its values file ------------------

def test_dashboard_copy_is_the_manifests_dashboard() -> None:
    copied = CHART / "files" / "egpu-dashboard.json"
    assert copied.read_bytes() == (MONITORING / "egpu-dashboard.json").read_bytes(), (
        f"copy manifests/monitoring/egpu-dashboard.json to {copied.relative_to(REPO)}")


def test_values_config_is_the_manifests_config() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    configmap = yaml.safe_load((MANIFESTS / "base" / "config.yaml").read_text())
    assert values["config"] == yaml.safe_load(configmap["data"]["config.yaml"])


# Maps whose keys are data (names), not settings: the comment on the map covers them.
DATA_MAPS = {"config.priorityClasses"}


def test_every_values_key_has_a_comment() -> None:
    lines = (CHART / "values.yaml").read_text().splitlines()
    stack: list[tuple[int, str]] = []  # (indent, dotted key) of the enclosing mappings
    previous = ""
    missing = []
    for line in lines:
        match = re.match(r"( *)([A-Za-z0-9_.-]+):", line)
        if match:
            indent = len(match.group(1))
            while stack and stack[-1][0] >= indent:
                stack.pop()
            parent = stack[-1][1] if stack else ""
            key = f"{parent}.{match.group(2)}" if parent else match.group(2)
            if parent not in DATA_MAPS and not previous.lstrip().startswith("#"):
                missing.append(key)
            stack.append((indent, key))
        if line.strip():
            previous = line
    assert not missing, f"values.yaml keys without a comment: {missing}"


def _checksums(objects: Objects) -> dict[str, str]:
    return {_name(k): o["spec"]["template"]["metadata"].get("annotations", {})[CONFIG_CHECKSUM]
            for k, o in objects.items()
            if CONFIG_CHECKSUM in (o.get("spec", {}).get("template", {}).get("metadata", {})
                                   .get("annotations") or {})}


def test_a_config_change_rolls_exactly_the_parts_that_read_the_config_at_start(helm) -> None:
    """Bug caught: `helm upgrade --set config.memoryOversubscriptionRatio=2.0` changed only the
    ConfigMap; the extender kept booking at 1.5 until a manual restart. The extender and the
    node agents read the config at start: a config change must change their pod templates
    (a roll); the webhook reloads the file itself and must not roll; other values roll
    nothing through the checksum."""
    before = _checksums(helm())
    assert {n.split("/")[-1] for n in before} == {"egpu-scheduler", "egpu-node-agent"}, before
    after = _checksums(helm(**{"config.memoryOversubscriptionRatio": "2.0"}))
    assert all(after[n] != before[n] for n in before), (before, after)
    assert _checksums(helm(**{"webhook.replicas": "3"})) == before


@pytest.mark.parametrize(("value", "fragment"), [
    ("config.memoryOversubscriptionRatio=0.5", "memoryOversubscriptionRatio"),
    ("config.sharesPerCard=abc", "sharesPerCard"),
    ("config.defaults.priority=urgent", "priority"),
    ("loglevel=debug", "loglevel"),
    ("logLevel=verbose", "logLevel"),
    ("webhook.replicas=0", "replicas"),
    ("uninstall.capacityWaitSeconds=-1", "capacityWaitSeconds"),
    ("monitoring.prometheusURL=prometheus:9090", "prometheusURL"),
])
def test_a_bad_value_is_refused_by_helm_before_anything_renders(helm_env, value: str,
                                                                fragment: str) -> None:
    """charts/egpu/values.schema.json: helm itself refuses the value, naming it."""
    proc = subprocess.run([str(_binary("helm")), "template", "x", str(CHART), "--set", value],
                          capture_output=True, text=True, env=helm_env, timeout=60)
    assert proc.returncode != 0 and fragment in proc.stderr, proc.stderr


def test_a_float_given_with_set_renders_a_config_every_part_reads(helm) -> None:
    """`--set` leaves 2.0 as the text "2.0": the config must still read it as 2.0."""
    config = next(o for k, o in helm(**{"config.memoryOversubscriptionRatio": "2.0"}).items()
                  if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "egpu-config")
    assert load_config(config["data"]["config.yaml"]).memory_oversubscription_ratio == 2.0


# --- helm uninstall takes egpu off the nodes (issue 22) ------------------------------------------

def test_the_uninstall_hook_deletes_the_agents_before_helm_deletes_their_rbac(helm) -> None:
    """Bug caught: a hook that runs after Helm's deletions (post-delete) or without a Job, or
    that names no DaemonSet, leaves every node's files, annotations and capacity behind
    (the agents lose their ClusterRoleBinding before they stop)."""
    hooks = helm(_hooks="true")
    job = hooks[("Job", NAMESPACE, "egpu-uninstall")]
    assert job["metadata"]["annotations"][HOOK] == "pre-delete"
    for key, obj in hooks.items():
        annotations = obj["metadata"]["annotations"]
        assert annotations[HOOK] == "pre-delete", _name(key)
        if key[0] != "Job":  # its RBAC exists before the Job runs
            assert int(annotations["helm.sh/hook-weight"]) < 0, _name(key)
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["egpu-node-agent", "uninstall"]
    assert "--daemonsets=egpu-node-agent" in container["args"]
    assert "--capacity-wait-seconds=360" in container["args"]
    pool = helm(_hooks="true", **{"dra.enabled": "true", "dra.nodeSelector.pool": "dra"})
    args = pool[("Job", NAMESPACE, "egpu-uninstall")]["spec"]["template"]["spec"][
        "containers"][0]["args"]
    assert "--daemonsets=egpu-node-agent,egpu-node-agent-dra" in args
    assert helm(_hooks="true", **{"uninstall.cleanNodes": "false"}) == {}


def test_the_agent_knows_its_pod_and_mounts_what_it_removes(helm) -> None:
    """Bug caught: an agent without POD_NAME/POD_NAMESPACE never learns that its DaemonSet is
    going; one without the install folder mounted leaves /usr/local/egpu on the node."""
    agent = helm()[("DaemonSet", NAMESPACE, "egpu-node-agent")]["spec"]["template"]["spec"]
    container = next(c for c in agent["containers"] if c["name"] == "agent")
    env = {e["name"]: e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
           for e in container["env"]}
    assert env["POD_NAME"] == "metadata.name" and env["POD_NAMESPACE"] == "metadata.namespace"
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    assert mounts["/usr/local/egpu"] == "install"


def test_a_prometheus_url_value_is_what_kubectl_egpu_advise_reads(helm) -> None:
    """monitoring.prometheusURL renders the ConfigMap `kubectl egpu advise` reads (the names of
    egpu.contract); unset, nothing (the default render stays kustomize's)."""
    from egpu.contract import MONITORING_CONFIG_MAP, MONITORING_PROMETHEUS_URL_KEY

    url = "http://prometheus-k8s.monitoring.svc:9090"
    on = helm(**{"monitoring.prometheusURL": url})
    found = on[("ConfigMap", NAMESPACE, MONITORING_CONFIG_MAP)]
    assert found["data"] == {MONITORING_PROMETHEUS_URL_KEY: url}
    assert ("ConfigMap", NAMESPACE, MONITORING_CONFIG_MAP) not in helm()


def test_the_webhook_is_sent_the_configured_aliases_and_never_ignored_namespaces(helm) -> None:
    """The MutatingWebhookConfiguration follows the config. Bugs caught: a pod asking for a
    configured alias (hami.io/gpumem) never reached the webhook, which would have rewritten it
    (it went Pending on a resource no node has); a pod of an ignoredNamespaces namespace was
    still sent to the webhook, and refused (failurePolicy Fail) while no replica answered."""
    def hook(**values: str) -> dict[str, Any]:
        webhook = helm(**values)[("MutatingWebhookConfiguration", "", "egpu-webhook")]
        return dict(webhook["webhooks"][0])

    default = hook()
    assert default["namespaceSelector"]["matchExpressions"][0]["values"] == [
        "kube-system", NAMESPACE]
    expression = default["matchConditions"][0]["expression"]
    assert expression.count("k.startsWith('egpu.io/') || k.startsWith('volcano.sh/vgpu-')") == 4
    aliased = hook(**{"config.resourceAliases.hami\\.io/gpumem": "egpu.io/gpu-memory",
                      "config.ignoredNamespaces": "{kube-system,volcano-jobs}"})
    assert aliased["namespaceSelector"]["matchExpressions"][0]["values"] == [
        "kube-system", NAMESPACE, "volcano-jobs"]
    expression = aliased["matchConditions"][0]["expression"]
    assert expression.count("k.startsWith('egpu.io/') || k == 'hami.io/gpumem'") == 4
    assert "volcano.sh" not in expression  # configured aliases replace the defaults


@pytest.mark.parametrize(("values", "message"), [
    ({"config.allocationMode": "dra"}, "dra.enabled is false"),
    ({"config.namespaceAllocationModes.ml": "dra"}, "dra.enabled is false"),
    ({"config.resourceAliases.nvidia\\.com/gpu": "egpu.io/gpu"}, "nvidia.com/gpu"),
    ({"config.resourceAliases.egpu\\.io/gpu-cores": "egpu.io/gpu-cores"}, "egpu.io/gpu-cores"),
    ({"config.heartbeatTimeoutSeconds": "10"}, "heartbeatTimeoutSeconds"),
])
def test_values_no_egpu_part_would_run_with_are_refused_at_install(
        helm_env: dict[str, str], values: dict[str, str], message: str) -> None:
    """Bugs caught: allocationMode dra without dra.enabled rendered, and every GPU pod of that
    mode was then refused (the webhook had no API access for claims); aliases every egpu part
    refuses passed the schema (no part would start on that config); a heartbeat timeout below
    the agent's 30 s beat made nodes flap."""
    argv: list[str | Path] = [_binary("helm"), "template", RELEASE, CHART, "--namespace",
                              NAMESPACE]
    for name, value in values.items():
        argv += ["--set", f"{name}={value}"]
    result = subprocess.run([str(a) for a in argv], capture_output=True, text=True,
                            timeout=120, cwd=REPO, env=helm_env)
    assert result.returncode != 0 and message in result.stderr, result.stderr
