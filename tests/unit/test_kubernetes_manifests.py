"""The Kubernetes manifests under deploy/kubernetes validate offline and fit together.

Standard kinds are checked against the Kubernetes API schemas kubernetes-validate ships (strict:
an unknown field is an error, as kubectl's server-side field validation makes it), the RayCluster
against KubeRay's own CRD schema vendored in deploy/kubernetes/schemas, made strict the same way.
Then the references between them: selectors, Secret and claim names, the head Service the API
reaches, the Ray resources each worker group advertises. Every check is also run on a copy broken
on purpose, so that a check which could never fail is caught.
"""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import jsonschema  # type: ignore[import-untyped]  # ships no type information
import kubernetes_validate  # type: ignore[import-untyped]  # ships no type information
import pytest
import yaml  # type: ignore[import-untyped]  # no stubs installed (types-PyYAML)

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy" / "kubernetes"
RAYCLUSTER_SCHEMA = DEPLOY / "schemas" / "ray.io_rayclusters.v1.yaml"
# The oldest Kubernetes the README promises and the newest kubernetes-validate knows.
KUBERNETES_VERSIONS = ("1.30", "1.37")
RUNGS = ("namespaces", "gvisor", "microvm")
IMAGE = "sandcell"

Doc = dict[str, Any]


def _load_yaml(path: Path) -> list[Doc]:
    return [d for d in yaml.load_all(path.read_text(encoding="utf-8"), Loader=yaml.SafeLoader) if d]


def _kustomization() -> Doc:
    docs = _load_yaml(DEPLOY / "kustomization.yaml")
    assert len(docs) == 1
    return docs[0]


@pytest.fixture(scope="module")
def docs() -> list[Doc]:
    """Every resource kustomization.yaml lists, in its order."""
    out: list[Doc] = []
    for name in _kustomization()["resources"]:
        out.extend(_load_yaml(DEPLOY / name))
    return out


def _one(docs: list[Doc], kind: str, name: str | None = None) -> Doc:
    found = [d for d in docs if d["kind"] == kind and name in (None, d["metadata"]["name"])]
    assert len(found) == 1, (kind, name, len(found))
    return found[0]


def _pod_templates(docs: list[Doc]) -> Iterator[tuple[str, Doc]]:
    """(where, pod template) of every workload, the RayCluster's groups included."""
    for d in docs:
        where = f"{d['kind']}/{d['metadata']['name']}"
        if d["kind"] in ("Deployment", "StatefulSet"):
            yield where, d["spec"]["template"]
        elif d["kind"] == "RayCluster":
            yield f"{where}/head", d["spec"]["headGroupSpec"]["template"]
            for g in d["spec"].get("workerGroupSpecs", []):
                yield f"{where}/{g['groupName']}", g["template"]


def _containers(template: Doc) -> list[Doc]:
    spec = template["spec"]
    return [*spec.get("initContainers", []), *spec["containers"]]


def _env(container: Doc) -> dict[str, Doc]:
    return {e["name"]: e for e in container.get("env", [])}


# -- the schemas ------------------------------------------------------------------------------


def _strict(schema: Any) -> Any:
    """The schema with ``additionalProperties: false`` wherever an object lists its properties
    and neither allows others nor keeps unknown fields: what the API server's structural pruning
    and strict field validation do with such a CRD, which plain JSON Schema would let through."""
    if isinstance(schema, list):
        return [_strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _strict(v) for k, v in schema.items()}
    if (
        "properties" in out
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


@pytest.fixture(scope="module")
def raycluster_validator() -> Any:
    # libyaml's loader where PyYAML has it: the schema is 400 kB, 10 times faster to read so.
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    schema = yaml.load(RAYCLUSTER_SCHEMA.read_text(encoding="utf-8"), Loader=loader)
    # OpenAPI v3 schemas are JSON Schema draft 4 with extensions (x-kubernetes-*), which
    # validators ignore as unknown keywords.
    jsonschema.Draft4Validator.check_schema(schema)
    return jsonschema.Draft4Validator(_strict(schema))


def _standard_errors(doc: Doc, version: str) -> list[str]:
    try:
        kubernetes_validate.validate(doc, version, strict=True)
    except kubernetes_validate.ValidationError as exc:
        return [f"{'.'.join(map(str, exc.path))}: {exc.message}"]
    return []


def _raycluster_errors(validator: Any, doc: Doc) -> list[str]:
    return [f"{'.'.join(map(str, e.path))}: {e.message}" for e in validator.iter_errors(doc)]


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_standard_kinds_match_the_kubernetes_schemas(docs: list[Doc], version: str) -> None:
    standard = [d for d in docs if d["apiVersion"] != "ray.io/v1"]
    assert {d["kind"] for d in standard} == {
        "Namespace",
        "Secret",
        "Service",
        "StatefulSet",
        "PersistentVolumeClaim",
        "Deployment",
    }
    for d in standard:
        assert _standard_errors(d, version) == [], (d["kind"], d["metadata"]["name"])
    # The RayCluster's pod templates are Kubernetes pod templates too: check them against
    # Kubernetes' own schema as well as KubeRay's copy of it.
    for where, template in _pod_templates(docs):
        wrapped = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"}}
        assert _standard_errors({**wrapped, "template": template}, version) == [], where


def _set_replicas_text(d: Doc) -> None:
    d["spec"]["replicas"] = "two"


def _misspell_container_field(d: Doc) -> None:
    d["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {}


def _drop_containers(d: Doc) -> None:
    del d["spec"]["template"]["spec"]["containers"]


@pytest.mark.parametrize(
    "breakage", [_set_replicas_text, _misspell_container_field, _drop_containers]
)
def test_the_kubernetes_schemas_reject_a_broken_deployment(
    docs: list[Doc], breakage: Callable[[Doc], None]
) -> None:
    broken = copy.deepcopy(_one(docs, "Deployment"))
    breakage(broken)
    assert _standard_errors(broken, KUBERNETES_VERSIONS[-1])


def test_the_raycluster_matches_the_kuberay_schema(
    docs: list[Doc], raycluster_validator: Any
) -> None:
    assert _raycluster_errors(raycluster_validator, _one(docs, "RayCluster")) == []


def _misspell_ray_start_params(d: Doc) -> None:
    d["spec"]["workerGroupSpecs"][0]["rayStartParam"] = d["spec"]["workerGroupSpecs"][0].pop(
        "rayStartParams"
    )


def _resources_as_a_map(d: Doc) -> None:
    d["spec"]["workerGroupSpecs"][1]["rayStartParams"]["resources"] = {"sandcell_slots": 8}


def _drop_group_name(d: Doc) -> None:
    del d["spec"]["workerGroupSpecs"][2]["groupName"]


def _privileged_as_text(d: Doc) -> None:
    container = d["spec"]["workerGroupSpecs"][2]["template"]["spec"]["containers"][0]
    container["securityContext"]["privileged"] = "yes"


@pytest.mark.parametrize(
    "breakage",
    [_misspell_ray_start_params, _resources_as_a_map, _drop_group_name, _privileged_as_text],
)
def test_the_kuberay_schema_rejects_a_broken_raycluster(
    docs: list[Doc], raycluster_validator: Any, breakage: Callable[[Doc], None]
) -> None:
    broken = copy.deepcopy(_one(docs, "RayCluster"))
    breakage(broken)
    assert _raycluster_errors(raycluster_validator, broken)


def test_the_vendored_schema_keeps_its_notice_and_names_its_source() -> None:
    head = RAYCLUSTER_SCHEMA.read_text(encoding="utf-8")[:2000]
    assert "Licensed under the Apache License, Version 2.0" in head
    assert "KubeRay v1.7.0" in head
    readme = (DEPLOY / "schemas" / "README.md").read_text(encoding="utf-8")
    assert "ray-project/kuberay" in readme and "v1.7.0" in readme


# -- the references between manifests ---------------------------------------------------------


def _selector_problems(docs: list[Doc]) -> list[str]:
    """Workloads select their own pods; Services select a workload's pods on a port it has."""
    problems: list[str] = []
    pods: dict[str, Doc] = {}
    for d in docs:
        if d["kind"] not in ("Deployment", "StatefulSet"):
            continue
        name = d["metadata"]["name"]
        labels = d["spec"]["template"]["metadata"].get("labels", {})
        wanted = d["spec"]["selector"]["matchLabels"]
        if not wanted or not wanted.items() <= labels.items():
            problems.append(f"{name}: selector {wanted} misses the pod labels {labels}")
        pods[name] = d["spec"]["template"]
    for svc in (d for d in docs if d["kind"] == "Service"):
        name, selector = svc["metadata"]["name"], svc["spec"].get("selector", {})
        chosen = [
            w
            for w, t in pods.items()
            if selector and selector.items() <= t["metadata"].get("labels", {}).items()
        ]
        if len(chosen) != 1:
            problems.append(f"Service {name} selects {chosen}, not one workload")
            continue
        port_names = {p.get("name") for c in _containers(pods[chosen[0]]) for p in c["ports"]}
        port_numbers = {
            p["containerPort"] for c in _containers(pods[chosen[0]]) for p in c["ports"]
        }
        for port in svc["spec"]["ports"]:
            target = port.get("targetPort", port["port"])
            if target not in port_names | port_numbers:
                problems.append(f"Service {name}: targetPort {target} is no port of {chosen[0]}")
    for sts in (d for d in docs if d["kind"] == "StatefulSet"):
        services = {d["metadata"]["name"] for d in docs if d["kind"] == "Service"}
        if sts["spec"]["serviceName"] not in services:
            problems.append(f"StatefulSet {sts['metadata']['name']}: no Service of its serviceName")
    return problems


def _walk(node: Any, key: str) -> Iterator[Any]:
    """Every value stored under ``key`` anywhere inside ``node``."""
    if isinstance(node, dict):
        for k, v in node.items():
            if k == key:
                yield v
            yield from _walk(v, key)
    elif isinstance(node, list):
        for v in node:
            yield from _walk(v, key)


def _reference_problems(docs: list[Doc]) -> list[str]:
    """Every Secret key and claim that a pod names exists, and the shared volume is RWX and
    mounted where SANDCELL_SHARED_DIR points."""
    problems: list[str] = []
    secrets = {
        d["metadata"]["name"]: {**d.get("data", {}), **d.get("stringData", {})}
        for d in docs
        if d["kind"] == "Secret"
    }
    for ref in _walk(docs, "secretKeyRef"):
        if ref["key"] not in secrets.get(ref["name"], {}):
            problems.append(f"secretKeyRef {ref['name']}/{ref['key']} names no Secret key")
    claims = {d["metadata"]["name"]: d for d in docs if d["kind"] == "PersistentVolumeClaim"}
    for ref in _walk(docs, "persistentVolumeClaim"):
        if ref["claimName"] not in claims:
            problems.append(f"claim {ref['claimName']} is not among the manifests")
    # A StatefulSet's claim templates are volumes of its pods too.
    templated = {
        f"StatefulSet/{d['metadata']['name']}": [
            v["metadata"]["name"] for v in d["spec"].get("volumeClaimTemplates", [])
        ]
        for d in docs
        if d["kind"] == "StatefulSet"
    }
    for where, template in _pod_templates(docs):
        volumes = {v["name"]: v for v in template["spec"].get("volumes", [])}
        volumes.update({name: {} for name in templated.get(where, [])})
        for c in _containers(template):
            mounts = {m["mountPath"]: m["name"] for m in c.get("volumeMounts", [])}
            if any(m not in volumes for m in mounts.values()):
                problems.append(f"{where}/{c['name']}: a mount names no volume of the pod")
            shared = _env(c).get("SANDCELL_SHARED_DIR", {}).get("value")
            if shared is None and c["image"] == IMAGE:
                problems.append(f"{where}/{c['name']}: no SANDCELL_SHARED_DIR")
            if shared is None:
                continue
            claim = volumes.get(mounts.get(shared, ""), {}).get("persistentVolumeClaim")
            if claim is None:
                problems.append(f"{where}/{c['name']}: {shared} is not a mounted claim")
            elif "ReadWriteMany" not in claims[claim["claimName"]]["spec"]["accessModes"]:
                problems.append(f"{where}/{c['name']}: claim {claim['claimName']} is not RWX")
            if "SANDCELL_DATABASE_URL" not in _env(c):
                problems.append(f"{where}/{c['name']}: no SANDCELL_DATABASE_URL")
    return problems


def _secret_value(docs: list[Doc], name: str, key: str) -> str:
    return str(_one(docs, "Secret", name)["stringData"][key])


def _database_problems(docs: list[Doc]) -> list[str]:
    """The URL in the Secret reaches the PostgreSQL these manifests run, as its user."""
    ref = next(
        e["valueFrom"]["secretKeyRef"]
        for _, t in _pod_templates(docs)
        for c in _containers(t)
        for n, e in _env(c).items()
        if n == "SANDCELL_DATABASE_URL"
    )
    url = urlsplit(_secret_value(docs, ref["name"], ref["key"]))
    postgres = _one(docs, "StatefulSet")["spec"]["template"]["spec"]["containers"][0]
    env = _env(postgres)
    password_ref = env["POSTGRES_PASSWORD"]["valueFrom"]["secretKeyRef"]
    service = _one(docs, "Service", url.hostname)
    problems: list[str] = []
    if url.scheme != "postgresql":
        problems.append(f"scheme {url.scheme}")
    if url.port not in [p["port"] for p in service["spec"]["ports"]]:
        problems.append(f"port {url.port} is not the Service's")
    if url.username != env["POSTGRES_USER"]["value"]:
        problems.append(f"user {url.username} is not POSTGRES_USER")
    if url.path.lstrip("/") != env["POSTGRES_DB"]["value"]:
        problems.append(f"database {url.path} is not POSTGRES_DB")
    if url.password != _secret_value(docs, password_ref["name"], password_ref["key"]):
        problems.append("the URL's password is not POSTGRES_PASSWORD")
    return problems


def _advertised(params: Doc) -> dict[str, float]:
    """rayStartParams.resources as Ray reads it: JSON, quoted once more for the shell."""
    text = params.get("resources")
    if text is None:
        return {}
    assert text.startswith('"') and text.endswith('"'), text
    parsed = json.loads(json.loads(text))
    assert isinstance(parsed, dict)
    return parsed


def _options(args: list[str]) -> dict[str, str]:
    """``--name value`` pairs of a command line; a flag without a value maps to ""."""
    options: dict[str, str] = {}
    for i, arg in enumerate(args):
        if arg.startswith("--"):
            following = args[i + 1] if i + 1 < len(args) else "--"
            options[arg] = "" if following.startswith("--") else following
    return options


def _ray_problems(docs: list[Doc]) -> list[str]:
    """One worker group per rung, each advertising slots and its rung only, with what its rung
    needs; the head runs no sandbox; the API reaches the head's client port."""
    problems: list[str] = []
    cluster = _one(docs, "RayCluster")
    head = cluster["spec"]["headGroupSpec"]
    if _advertised(head.get("rayStartParams", {})) or head["rayStartParams"].get("num-cpus") != "0":
        problems.append("the head would run sandboxes")
    groups = {g["groupName"]: g for g in cluster["spec"]["workerGroupSpecs"]}
    if sorted(groups) != sorted(RUNGS):
        problems.append(f"worker groups {sorted(groups)}")
    for name, g in groups.items():
        resources = _advertised(g.get("rayStartParams", {}))
        rungs = {k for k in resources if k.startswith("sandcell_rung_")}
        if rungs != {f"sandcell_rung_{name}"} or resources[f"sandcell_rung_{name}"] != 1:
            problems.append(f"{name} advertises rungs {rungs}")
        if not (isinstance(resources.get("sandcell_slots"), int) and resources["sandcell_slots"]):
            problems.append(f"{name} advertises no sandcell_slots")
        spec = g["template"]["spec"]
        worker = spec["containers"][0]
        if worker.get("securityContext", {}).get("privileged") is not True:
            problems.append(f"{name}: not privileged")
        if name == "microvm":
            kvm = [
                v
                for v in spec.get("volumes", [])
                if v.get("hostPath", {}).get("path") == "/dev/kvm"
            ]
            mounted = {m["name"]: m["mountPath"] for m in worker.get("volumeMounts", [])}
            if len(kvm) != 1 or mounted.get(kvm[0]["name"]) != "/dev/kvm":
                problems.append("microvm: /dev/kvm is not mounted from the node")
            if not spec.get("nodeSelector"):
                problems.append("microvm: no nodeSelector for nodes with KVM")
            if _env(worker).get("SANDCELL_VM_ACCEL", {}).get("value") != "kvm":
                problems.append("microvm: may fall back to emulation")
    api = _one(docs, "Deployment")
    container = api["spec"]["template"]["spec"]["containers"][0]
    argv = container["command"]
    if argv[:2] != ["sandcell", "serve"]:
        problems.append(f"the API runs {argv[:2]}")
    options = _options(argv[2:])
    target = urlsplit(options.get("--cluster", ""))
    head_ports = {
        p["containerPort"] for p in head["template"]["spec"]["containers"][0].get("ports", [])
    }
    if target.scheme != "ray" or target.hostname != f"{cluster['metadata']['name']}-head-svc":
        problems.append(f"--cluster {options.get('--cluster')} is not the head Service")
    if target.port != 10001 or 10001 not in head_ports:
        problems.append("the API does not reach the head's Ray client port 10001")
    if options.get("--host") != "0.0.0.0":
        problems.append("the API listens on loopback only")
    port = int(options.get("--port", "0"))
    named = {p["name"]: p["containerPort"] for p in container["ports"]}
    # Readiness follows the shared database (/healthz); liveness must not (/livez), or an
    # outage would restart every replica and end its runs.
    for probe, path in (("readinessProbe", "/healthz"), ("livenessProbe", "/livez")):
        get = container.get(probe, {}).get("httpGet", {})
        if get.get("path") != path or named.get(get.get("port"), get.get("port")) != port:
            problems.append(f"the API's {probe} is not {path} on --port")
    # Each replica is reached by the others at its pod's address (they forward requests for
    # the sessions and runs it holds).
    pod_ip = _env(container).get("POD_IP", {}).get("valueFrom", {}).get("fieldRef", {})
    if (
        options.get("--advertise") != f"http://$(POD_IP):{port}"
        or pod_ip.get("fieldPath") != "status.podIP"
    ):
        problems.append("the API does not advertise its pod's address and --port")
    if api["spec"]["replicas"] < 2:
        problems.append("one API replica")
    return problems


def _image_problems(docs: list[Doc]) -> list[str]:
    """Every sandcell container names the image kustomization.yaml's images: replaces, so one
    line there sets them all; and the kustomization lists every manifest in this folder."""
    problems: list[str] = []
    kustomization = _kustomization()
    replaced = {i["name"] for i in kustomization["images"]}
    if replaced != {IMAGE}:
        problems.append(f"images: replaces {replaced}")
    for where, template in _pod_templates(docs):
        for c in _containers(template):
            if c["image"] != IMAGE and not where.startswith("StatefulSet/"):
                problems.append(f"{where}/{c['name']}: image {c['image']}")
    namespaces = [d["metadata"]["name"] for d in docs if d["kind"] == "Namespace"]
    if namespaces != [kustomization.get("namespace")]:
        problems.append(f"namespace {kustomization.get('namespace')} is not the one created")
    listed = set(kustomization["resources"])
    present = {p.name for p in DEPLOY.glob("*.yaml")} - {"kustomization.yaml"}
    if listed != present:
        problems.append(f"kustomization lists {sorted(listed)}, the folder has {sorted(present)}")
    return problems


CHECKS: dict[str, Callable[[list[Doc]], list[str]]] = {
    "selectors": _selector_problems,
    "references": _reference_problems,
    "database": _database_problems,
    "ray": _ray_problems,
    "images": _image_problems,
}


@pytest.mark.parametrize("check", sorted(CHECKS))
def test_the_manifests_fit_together(docs: list[Doc], check: str) -> None:
    assert CHECKS[check](docs) == []


def _api_pod(docs: list[Doc]) -> Doc:
    template: Doc = _one(docs, "Deployment")["spec"]["template"]
    return template


def _group(docs: list[Doc], name: str) -> Doc:
    groups = _one(docs, "RayCluster")["spec"]["workerGroupSpecs"]
    group: Doc = next(g for g in groups if g["groupName"] == name)
    return group


def _break_selector(docs: list[Doc]) -> None:
    _one(docs, "Deployment")["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"] = "x"


def _break_service(docs: list[Doc]) -> None:
    _one(docs, "Service", "sandcell-api")["spec"]["selector"] = {"app": "other"}


def _break_target_port(docs: list[Doc]) -> None:
    _one(docs, "Service", "sandcell-api")["spec"]["ports"][0]["targetPort"] = "web"


def _break_secret_name(docs: list[Doc]) -> None:
    env = _env(_api_pod(docs)["spec"]["containers"][0])
    env["SANDCELL_DATABASE_URL"]["valueFrom"]["secretKeyRef"]["name"] = "sandcell-db"


def _break_claim_mode(docs: list[Doc]) -> None:
    _one(docs, "PersistentVolumeClaim")["spec"]["accessModes"] = ["ReadWriteOnce"]


def _break_shared_dir(docs: list[Doc]) -> None:
    _env(_group(docs, "gvisor")["template"]["spec"]["containers"][0])["SANDCELL_SHARED_DIR"][
        "value"
    ] = "/data"


def _break_password(docs: list[Doc]) -> None:
    secret = _one(docs, "Secret")["stringData"]
    secret["POSTGRES_PASSWORD"] = "another"


def _break_rung(docs: list[Doc]) -> None:
    _group(docs, "gvisor")["rayStartParams"]["resources"] = (
        '"{\\"sandcell_slots\\": 8, \\"sandcell_rung_namespaces\\": 1}"'
    )


def _break_slots(docs: list[Doc]) -> None:
    _group(docs, "namespaces")["rayStartParams"]["resources"] = (
        '"{\\"sandcell_rung_namespaces\\": 1}"'
    )


def _break_kvm(docs: list[Doc]) -> None:
    _group(docs, "microvm")["template"]["spec"]["containers"][0]["volumeMounts"].pop()


def _break_privileged(docs: list[Doc]) -> None:
    _group(docs, "namespaces")["template"]["spec"]["containers"][0]["securityContext"] = {}


def _break_cluster_address(docs: list[Doc]) -> None:
    argv = _api_pod(docs)["spec"]["containers"][0]["command"]
    argv[argv.index("--cluster") + 1] = "ray://sandcell-head:10001"


def _break_probe(docs: list[Doc]) -> None:
    _api_pod(docs)["spec"]["containers"][0]["readinessProbe"]["httpGet"]["path"] = "/"


def _break_advertise(docs: list[Doc]) -> None:
    argv = _api_pod(docs)["spec"]["containers"][0]["command"]
    argv[argv.index("--advertise") + 1] = "http://sandcell-api:80"


def _break_image(docs: list[Doc]) -> None:
    _group(docs, "microvm")["template"]["spec"]["containers"][0]["image"] = "sandcell:latest"


BREAKAGES: dict[str, tuple[str, Callable[[list[Doc]], None]]] = {
    "selector": ("selectors", _break_selector),
    "service": ("selectors", _break_service),
    "target-port": ("selectors", _break_target_port),
    "secret-name": ("references", _break_secret_name),
    "claim-mode": ("references", _break_claim_mode),
    "shared-dir": ("references", _break_shared_dir),
    "password": ("database", _break_password),
    "rung": ("ray", _break_rung),
    "slots": ("ray", _break_slots),
    "kvm": ("ray", _break_kvm),
    "privileged": ("ray", _break_privileged),
    "cluster-address": ("ray", _break_cluster_address),
    "probe": ("ray", _break_probe),
    "advertise": ("ray", _break_advertise),
    "image": ("images", _break_image),
}


@pytest.mark.parametrize("breakage", sorted(BREAKAGES))
def test_each_reference_check_rejects_a_broken_copy(docs: list[Doc], breakage: str) -> None:
    check, breaker = BREAKAGES[breakage]
    broken = copy.deepcopy(docs)
    breaker(broken)
    assert CHECKS[check](broken)


def test_kustomize_renders_them_with_the_image_and_namespace_set(docs: list[Doc]) -> None:
    """What `kubectl apply -k` applies: kustomize's own build, whose image transformer must reach
    the RayCluster's containers too (a custom resource), and whose output still fits together."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed: its built-in kustomize renders the manifests")
    out = subprocess.run(
        [kubectl, "kustomize", str(DEPLOY)], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    rendered = [d for d in yaml.load_all(out.stdout, Loader=yaml.SafeLoader) if d]
    assert sorted((d["kind"], d["metadata"]["name"]) for d in rendered) == sorted(
        (d["kind"], d["metadata"]["name"]) for d in docs
    )
    kustomization = _kustomization()
    [image] = kustomization["images"]
    wanted = f"{image['newName']}:{image['newTag']}"
    for where, template in _pod_templates(rendered):
        for c in _containers(template):
            assert c["image"] == wanted or where.startswith("StatefulSet/"), (where, c["image"])
    for d in rendered:
        if d["kind"] != "Namespace":
            assert d["metadata"]["namespace"] == kustomization["namespace"], d["metadata"]
    for name in ("selectors", "references", "database", "ray"):
        assert CHECKS[name](rendered) == [], name
