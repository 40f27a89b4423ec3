"""The deployment files (Dockerfile, deploy/compose.yaml, deploy/k8s/), validated offline.

No Docker daemon and no Kubernetes cluster are needed. What is checked, and against what:

- Dockerfile: parsed by the ``dockerfile`` package (BuildKit's own parser). Every COPY source exists and is
  not excluded by .dockerignore; setuptools builds the package metadata from exactly the copied files and
  finds the ``lbt`` entry point and every module the manifests run; ENTRYPOINT and CMD parse with lbt's
  parser; the image's user is the one the manifests run as.
- Compose: the compose-spec JSON schema (vendored in tests/schemas/, see its README), and
  ``docker compose config -q`` where a Compose v2 binary exists.
- Kubernetes: every object against the Kubernetes JSON schemas shipped by kubernetes-validate, strict
  (an unknown field is an error), for the oldest release the manifests need (1.28: the StatefulSet
  pod-index label) and the newest the package ships; ``kubectl kustomize`` where kubectl exists.
- Agreement: the images, ports, environment, mounts and commands of compose and Kubernetes agree with each
  other, with deploy/k8s/cluster.json and the spec, and with what ``lbt`` and the process entry points
  accept, parsed by their real argparse parsers. Prometheus: promtool checks both configurations and the
  rule files the mounts put in place; the Kubernetes relabelling runs in promtool on pods built from the
  manifests, and must label every process as ``lbt cluster up --with-prometheus`` does.
- The commands run: the manifests' node host, dispatcher, wait-for-cluster and load commands start a
  cluster on loopback (one 127.0.0.x address per host) and drive it with a short load.

The process entry points take what the manifests need from them: ``--listen HOST:PORT`` and the token from
the environment (``LBT_TOKEN``) for a cluster file without one.
"""

from __future__ import annotations

import copy
import fnmatch
import functools
import importlib
import io
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import tomllib
import urllib.request
from collections.abc import Iterator
from contextlib import redirect_stdout
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

import dockerfile
import jsonschema
import kubernetes_validate
import pytest
import yaml
from packaging.specifiers import SpecifierSet

from lbtestbed.cli import build_parser
from lbtestbed.cluster import prometheus as lbt_prometheus
from lbtestbed.model.document import document
from lbtestbed.model.experiment import Experiment
from lbtestbed.spec import load_spec
from lbtestbed.transport import wire
from lbtestbed.transport.cluster_file import ClusterFile, Endpoint

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
COMPOSE_FILE = DEPLOY / "compose.yaml"
SCHEMAS = Path(__file__).resolve().parent / "schemas"
CLUSTER_JSON = K8S / "cluster.json"
SPEC_TOML = K8S / "spec.toml"

PROCESS_MODULES = {"lbtestbed.server_node": "nodes", "lbtestbed.dispatcher": "dispatcher"}
K8S_OLDEST = "1.28.0"  # the StatefulSet's apps.kubernetes.io/pod-index label is there from 1.28
K8S_VERSIONS = (K8S_OLDEST, kubernetes_validate.utils.latest_version())

# ------------------------------------------------------------------------------------------ loading


def pyproject() -> dict[str, Any]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def image_name() -> str:
    return f"lbtestbed:{pyproject()['project']['version']}"


def dockerfile_commands() -> list[Any]:
    return list(dockerfile.parse_file(str(ROOT / "Dockerfile")))


def instructions(cmd: str) -> list[Any]:
    return [c for c in dockerfile_commands() if c.cmd == cmd]


def exec_form(cmd: str) -> list[str]:
    """The value of the one ENTRYPOINT or CMD instruction, which must be in exec (JSON) form."""
    (c,) = instructions(cmd)
    assert c.json, f"Dockerfile line {c.start_line}: {cmd} must be in exec form, not run through a shell"
    return list(c.value)


@functools.cache
def _yaml_documents(path: Path) -> tuple[Any, ...]:
    return tuple(d for d in yaml.safe_load_all(path.read_text()) if d is not None)


def yaml_documents(path: Path) -> list[Any]:
    """The documents of a YAML file, parsed once per session; a fresh copy for each caller to change."""
    return copy.deepcopy(list(_yaml_documents(path)))


def compose() -> dict[str, Any]:
    (data,) = yaml_documents(COMPOSE_FILE)
    assert isinstance(data, dict)
    return data


def kustomization() -> dict[str, Any]:
    (data,) = yaml_documents(K8S / "kustomization.yaml")
    assert isinstance(data, dict)
    return data


def k8s_objects() -> list[dict[str, Any]]:
    """Every object of every resource file the kustomization lists, in order."""
    out = []
    for name in kustomization()["resources"]:
        out += yaml_documents(K8S / name)
    return out


def k8s_object(kind: str, name: str) -> dict[str, Any]:
    found = [o for o in k8s_objects() if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name} in deploy/k8s, found {len(found)}"
    return found[0]


def workloads() -> list[dict[str, Any]]:
    return [o for o in k8s_objects() if o["kind"] in ("Deployment", "StatefulSet", "Job")]


def k8s_container(kind: str, name: str, container: str, init: bool = False) -> dict[str, Any]:
    spec = k8s_object(kind, name)["spec"]["template"]["spec"]
    found = [c for c in spec.get("initContainers" if init else "containers", []) if c["name"] == container]
    assert len(found) == 1, f"{kind} {name}: expected one container {container}"
    return found[0]


def cluster_json() -> dict[str, Any]:
    data = json.loads(CLUSTER_JSON.read_text())
    assert isinstance(data, dict)
    return data


def cluster_file() -> ClusterFile:
    """deploy/k8s/cluster.json as the dataclass, built directly: it holds no token (that comes from env)."""
    data = cluster_json()
    return ClusterFile(
        spec=data["spec"],
        experiment_document=data["experiment_document"],
        token="",
        dispatchers=[Endpoint(**e) for e in data["dispatchers"]],
        node_hosts=[Endpoint(**e) for e in data["node_hosts"]],
        max_tasks=data["max_tasks"],
    )


def experiment() -> Experiment:
    """The experiment the deployment's processes run: the cluster file's, resolved as written."""
    return cluster_file().experiment()


def runs_the_clusters_experiment(overrides: list[str]) -> bool:
    """Whether the spec with ``overrides`` is the experiment the cluster file holds, to the last bit."""
    return document(load_spec(str(SPEC_TOML), overrides)) == cluster_json()["experiment_document"]


# ------------------------------------------------------------------------- commands as containers run them


def as_list(value: str | list[str] | None) -> list[str] | None:
    if value is None:
        return None
    return shlex.split(value) if isinstance(value, str) else [str(v) for v in value]


def compose_argv(service: str) -> list[str]:
    """The command line of a compose service: entrypoint replaces the image's and drops its CMD."""
    svc = compose()["services"][service]
    assert svc["image"] == image_name(), f"{service}: not an lbtestbed service"
    entry, cmd = as_list(svc.get("entrypoint")), as_list(svc.get("command"))
    if entry is None:
        return exec_form("ENTRYPOINT") + (exec_form("CMD") if cmd is None else cmd)
    return entry + (cmd or [])


K8S_VAR = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def k8s_argv(container: dict[str, Any], env: dict[str, str] | None = None) -> list[str]:
    """The command line of a Kubernetes container: command replaces ENTRYPOINT, args replace CMD, and
    ``$(VAR)`` references are expanded from ``env`` (Kubernetes' dependent environment variables)."""
    assert container["image"] == image_name(), f"{container['name']}: not an lbtestbed container"
    command, args = container.get("command"), container.get("args")
    if command is None:
        argv = exec_form("ENTRYPOINT") + (exec_form("CMD") if args is None else [str(a) for a in args])
    else:
        argv = [str(c) for c in command] + [str(a) for a in args or []]
    if env is not None:
        argv = [K8S_VAR.sub(lambda m: env[m.group(1)], a) for a in argv]
    return argv


def node_argv_k8s(j: int) -> list[str]:
    return k8s_argv(k8s_container("StatefulSet", "nodes", "nodes"), {"POD_INDEX": str(j)})


def process_argvs() -> dict[str, list[str]]:
    """Every dispatcher and node-host command line of both deployments, by a readable name."""
    out = {"compose dispatcher": compose_argv("dispatcher")}
    out["k8s dispatcher"] = k8s_argv(k8s_container("Deployment", "dispatcher", "dispatcher"))
    for j in range(len(cluster_json()["node_hosts"])):
        out[f"compose nodes-{j}"] = compose_argv(f"nodes-{j}")
        out[f"k8s nodes-{j}"] = node_argv_k8s(j)
    return out


def option(argv: list[str], name: str) -> str:
    assert argv.count(name) == 1, f"{name} must appear once in {argv}"
    return argv[argv.index(name) + 1]


def shell_script(argv: list[str]) -> str:
    assert argv[:2] == ["sh", "-c"] and len(argv) == 3, f"expected sh -c SCRIPT, got {argv}"
    return argv[2]


def commands_in_script(script: str, program: str) -> list[list[str]]:
    """The simple commands of ``program`` in a shell script, without redirections."""
    out = []
    for part in re.split(r";|&&|\|\|", script):
        words = shlex.split(part)
        while words[:1] and words[0] in ("do", "then", "else", "!"):
            words = words[1:]
        if words[:1] == [program]:
            out.append([w for w in words if not re.match(r"^\d?>", w) and not w.startswith("/dev/null")])
    return out


def parse_lbt(argv: list[str]) -> Any:
    """Parse a command line with lbt's own parser; an argparse error fails the test with its message."""
    assert argv[0] == "lbt", argv
    err = io.StringIO()
    try:
        from contextlib import redirect_stderr

        with redirect_stderr(err), redirect_stdout(io.StringIO()):
            return build_parser().parse_args(argv[1:])
    except SystemExit as e:
        if e.code == 0:  # --help
            return None
        pytest.fail(f"lbt rejects {shlex.join(argv)}: {err.getvalue().strip()}")


# -------------------------------------------------------------------------------------- Dockerfile


def dockerignore_patterns() -> list[str]:
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    return [ln.strip() for ln in lines if ln.strip() and not ln.strip().startswith("#")]


def _pattern_regex(pattern: str) -> re.Pattern[str]:
    """A .dockerignore pattern (Go filepath.Match plus ``**``) as a regular expression on a clean path."""
    out, i = "", 0
    pattern = pattern.strip("/")
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return re.compile(out)


def docker_ignored(path: str) -> bool:
    """Whether the build context leaves ``path`` out: a pattern that matches it or one of its parent
    directories excludes it, a later ``!`` pattern takes it back (the last match wins)."""
    parts = PurePosixPath(path).parts
    prefixes = ["/".join(parts[: k + 1]) for k in range(len(parts))]
    ignored = False
    for pattern in dockerignore_patterns():
        negate = pattern.startswith("!")
        rx = _pattern_regex(pattern.lstrip("!"))
        if any(rx.fullmatch(p) for p in prefixes):
            ignored = not negate
    return ignored


def copies() -> list[tuple[list[str], str]]:
    """(sources, destination) of every COPY/ADD."""
    out = []
    for c in instructions("COPY") + instructions("ADD"):
        assert not any(f.startswith("--from") for f in c.flags), "multi-stage copies are not expected here"
        *sources, dest = c.value
        out.append((list(sources), dest))
    return out


def test_the_base_image_is_a_python_the_package_supports() -> None:
    (base,) = instructions("FROM")
    m = re.fullmatch(r"python:(\d+\.\d+)(?:\.\d+)?-slim(?:-\w+)?", base.value[0])
    assert m, (
        f"Dockerfile line {base.start_line}: expected an official python:X.Y-slim base, got {base.value}"
    )
    requires = SpecifierSet(pyproject()["project"]["requires-python"])
    assert requires.contains(m.group(1)), f"python {m.group(1)} does not satisfy requires-python {requires}"


def test_every_copy_source_is_in_the_build_context() -> None:
    for sources, _ in copies():
        for src in sources:
            assert (ROOT / src).exists(), f"Dockerfile copies {src}, which does not exist"
            assert not docker_ignored(src), f"Dockerfile copies {src}, which .dockerignore leaves out"


def test_dockerignore_keeps_state_and_history_out_and_the_sources_in() -> None:
    for path in (".venv/bin/python", ".git/HEAD", ".lbt/cluster.json", "lbtestbed/__pycache__/cli.pyc"):
        assert docker_ignored(path), f"{path} would be sent to the Docker daemon"
    for path in ("lbtestbed/cli/__init__.py", "lbtestbed/server_node/__main__.py", "pyproject.toml"):
        assert not docker_ignored(path), f"{path} would be missing from the build context"


def context_copy(tmp_path: Path) -> Path:
    """The directory ``pip install`` installs from in the image, filled as its COPY instructions fill it
    (a directory source copies its contents; .dockerignore applied), under ``tmp_path``."""
    (install,) = [c for c in instructions("RUN") if "pip install" in c.value[0]]
    target = PurePosixPath(shlex.split(install.value[0])[2])
    image = tmp_path / "image"

    def put(src: Path, dest: PurePosixPath) -> None:
        if not docker_ignored(src.relative_to(ROOT).as_posix()):
            out = image / dest.relative_to("/")
            out.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, out)

    for sources, dest in copies():
        if not PurePosixPath(dest).is_relative_to(target):
            continue  # copied elsewhere (examples/ into the working directory): not part of the install
        into_dir = dest.endswith("/") or len(sources) > 1
        for s in sources:
            if (ROOT / s).is_dir():
                for f in (ROOT / s).rglob("*"):
                    if f.is_file():
                        put(f, PurePosixPath(dest) / f.relative_to(ROOT / s).as_posix())
            else:
                put(ROOT / s, PurePosixPath(dest) / s if into_dir else PurePosixPath(dest))
    return image / target.relative_to("/")


def test_the_install_step_gives_lbt_and_every_module_the_manifests_run(tmp_path: Path) -> None:
    """setuptools' egg_info on the copied files: the metadata ``pip install`` builds the package from."""
    src = context_copy(tmp_path)
    meta = tmp_path / "meta"
    meta.mkdir()
    done = subprocess.run(
        [sys.executable, "-c", "from setuptools import setup; setup()", "-q", "egg_info", "--egg-base", meta],
        cwd=src,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, f"the package does not build from the image's copy: {done.stderr[-2000:]}"
    (info,) = meta.glob("*.egg-info")
    sources = set((info / "SOURCES.txt").read_text().split())
    scripts = (info / "entry_points.txt").read_text()
    (entry,) = exec_form("ENTRYPOINT")
    assert re.search(rf"^{re.escape(entry)} = lbtestbed\.cli:main$", scripts, re.M), scripts
    modules = set()
    for argv in [*process_argvs().values(), compose_argv("prometheus-constants")]:
        words = argv if argv[0] != "sh" else shlex.split(shell_script(argv))
        modules |= {words[i + 1] for i, w in enumerate(words[:-1]) if w == "-m" and words[i - 1] == "python"}
    assert modules >= set(PROCESS_MODULES), modules
    for module in modules:
        path = module.replace(".", "/")
        assert {f"{path}/__main__.py", f"{path}.py"} & sources, f"the image would not contain {module}"


def test_entrypoint_is_lbt_and_cmd_parses() -> None:
    assert exec_form("ENTRYPOINT") == ["lbt"]
    target = pyproject()["project"]["scripts"]["lbt"]
    module, func = target.split(":")
    assert callable(getattr(importlib.import_module(module), func))
    parse_lbt(exec_form("ENTRYPOINT") + exec_form("CMD"))


def image_user() -> tuple[int, int]:
    (user,) = instructions("USER")
    uid, _, gid = user.value[0].partition(":")
    assert uid.isdigit() and gid.isdigit(), "USER must be numeric uid:gid, so that runAsNonRoot can check it"
    assert int(uid) != 0, "the image must not run as root"
    return int(uid), int(gid)


def test_the_manifests_run_lbtestbed_as_the_images_user() -> None:
    uid, gid = image_user()
    for w in workloads():
        pod = w["spec"]["template"]["spec"]
        for c in pod.get("initContainers", []) + pod["containers"]:
            if c["image"] != image_name():
                continue
            ctx = {**pod.get("securityContext", {}), **c.get("securityContext", {})}
            assert (ctx.get("runAsUser"), ctx.get("runAsGroup")) == (uid, gid), f"{w['metadata']['name']}"
            assert ctx.get("allowPrivilegeEscalation") is False and ctx.get("readOnlyRootFilesystem") is True


# ----------------------------------------------------------------------------------------- compose


def compose_validator() -> jsonschema.protocols.Validator:
    schema = json.loads((SCHEMAS / "compose-spec.json").read_text())
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def schema_errors(validator: jsonschema.protocols.Validator, doc: Any) -> list[str]:
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(doc)]


def test_compose_file_follows_the_compose_spec() -> None:
    assert schema_errors(compose_validator(), compose()) == []


def test_the_compose_schema_catches_a_misspelt_key() -> None:
    """The check above can fail: the same file with one key misspelt does not validate."""
    doc = compose()
    doc["services"]["dispatcher"]["entrypiont"] = doc["services"]["dispatcher"].pop("entrypoint")
    assert any("entrypiont" in e for e in schema_errors(compose_validator(), doc))


def compose_binary() -> list[str] | None:
    """``docker compose`` (the CLI plugin) or a standalone Compose v2 ``docker-compose``, if either exists."""
    for cmd in (["docker", "compose"], ["docker-compose"]):
        if shutil.which(cmd[0]) is None:
            continue
        done = subprocess.run([*cmd, "version"], capture_output=True, text=True, timeout=30)
        if done.returncode == 0 and re.search(r"v2\.\d+", done.stdout):
            return cmd
    return None


def test_docker_compose_accepts_the_file_and_requires_the_token() -> None:
    cmd = compose_binary()
    if cmd is None:
        pytest.skip("no Docker Compose v2 here (docker compose plugin or docker-compose)")
    env = {k: v for k, v in os.environ.items() if k != "LBT_TOKEN"}
    args = [*cmd, "-f", str(COMPOSE_FILE), "config", "-q"]
    ok = subprocess.run(args, env={**env, "LBT_TOKEN": "0" * 32}, capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0, ok.stderr
    missing = subprocess.run(args, env=env, capture_output=True, text=True, timeout=60)
    assert missing.returncode != 0 and "LBT_TOKEN" in missing.stderr, (
        "the token must be required, not defaulted"
    )


def bind_mounts(service: dict[str, Any]) -> list[tuple[str, str]]:
    """(host path, container path) of a service's bind mounts (short syntax, relative host paths)."""
    out = []
    for v in service.get("volumes", []):
        source, target = v.split(":")[:2]
        if source.startswith((".", "/")):
            out.append((source, target))
    return out


def test_every_file_compose_mounts_exists() -> None:
    doc = compose()
    for name, cfg in doc["configs"].items():
        if "file" in cfg:
            assert (DEPLOY / cfg["file"]).is_file(), f"config {name}: {cfg['file']} does not exist"
    for name, svc in doc["services"].items():
        for source, _ in bind_mounts(svc):
            assert (DEPLOY / source).exists(), f"service {name} mounts {source}, which does not exist"
        if "build" in svc:
            assert (DEPLOY / svc["build"]["context"] / svc["build"]["dockerfile"]).resolve() == (
                ROOT / "Dockerfile"
            )


# -------------------------------------------------------------------------------------- Kubernetes


def test_kustomization_lists_files_that_exist_and_parse() -> None:
    k = kustomization()
    files = list(k["resources"])
    files += [f for g in k.get("configMapGenerator", []) for f in g.get("files", [])]
    for f in files:
        assert (K8S / f).is_file(), f"kustomization.yaml lists {f}, which does not exist"
    seen = set()
    for o in k8s_objects():
        key = (o["kind"], o["metadata"]["name"])
        assert key not in seen, f"{key} defined twice"
        seen.add(key)
    assert {"StatefulSet", "Deployment", "Service", "Job"} <= {kind for kind, _ in seen}
    # the token.env the secretGenerator reads is the user's, never committed
    (gen,) = [g for g in k["secretGenerator"] if g["name"] == "lbt-token"]
    assert gen["envs"] == ["token.env"] and "token.env" in (K8S / ".gitignore").read_text().split()


def k8s_errors(obj: dict[str, Any], version: str) -> str | None:
    try:
        kubernetes_validate.validate(obj, version, strict=True)
    except kubernetes_validate.ValidationError as e:
        return f"{obj['kind']} {obj['metadata']['name']}: {'.'.join(map(str, e.path))}: {e.message}"
    return None


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_every_k8s_object_follows_its_schema(version: str) -> None:
    errors = [e for o in k8s_objects() if (e := k8s_errors(o, version))]
    assert errors == []


def test_the_k8s_schemas_catch_a_misspelt_field() -> None:
    """The check above can fail: a StatefulSet with `replica` for `replicas` does not validate."""
    sts = copy.deepcopy(k8s_object("StatefulSet", "nodes"))
    sts["spec"]["replica"] = sts["spec"].pop("replicas")
    assert k8s_errors(sts, K8S_OLDEST) is not None


@pytest.fixture(scope="module")
def kustomized(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """``kubectl kustomize`` of a copy of deploy/k8s with a token.env, as a user would have it."""
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl is not installed")
    copy_dir = tmp_path_factory.mktemp("k8s") / "k8s"
    shutil.copytree(K8S, copy_dir, ignore=shutil.ignore_patterns("token.env"))
    (copy_dir / "token.env").write_text("token=" + "ab" * 16 + "\n")
    done = subprocess.run(["kubectl", "kustomize", str(copy_dir)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d is not None]


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_the_kustomize_build_follows_the_schemas(kustomized: list[dict[str, Any]], version: str) -> None:
    assert [e for o in kustomized if (e := k8s_errors(o, version))] == []


def test_the_kustomize_build_mounts_the_experiment_and_the_token(kustomized: list[dict[str, Any]]) -> None:
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for o in kustomized:
        by_kind.setdefault(o["kind"], []).append(o)
    (cm,) = [c for c in by_kind["ConfigMap"] if c["metadata"]["name"].startswith("lbt-experiment-")]
    assert cm["data"] == {"spec.toml": SPEC_TOML.read_text(), "cluster.json": CLUSTER_JSON.read_text()}
    (secret,) = by_kind["Secret"]
    assert set(secret["data"]) == {"token"}
    # every reference to a generated object points to its hashed name
    names = {o["metadata"]["name"] for o in kustomized}
    for w in (o for o in kustomized if o["kind"] in ("Deployment", "StatefulSet", "Job")):
        pod = w["spec"]["template"]["spec"]
        for v in pod.get("volumes", []):
            if "configMap" in v and not v["configMap"].get("optional"):
                assert v["configMap"]["name"] in names, (w["metadata"]["name"], v)
        for c in pod.get("initContainers", []) + pod["containers"]:
            for e in c.get("env", []):
                ref = e.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    assert ref["name"] == secret["metadata"]["name"] and ref["key"] == "token"


# --------------------------------------------------------------------------- the experiment itself


def test_the_deployment_spec_loads_with_the_cluster_files_overrides() -> None:
    exp = experiment()
    assert exp.n == sum(len(h["nodes"]) for h in cluster_json()["node_hosts"])
    # the file's experiment is the spec's with the overrides the load generator gives it: none drifted
    (load,) = {
        tuple(parse_lbt(a).set)
        for a in (compose_argv("load"), k8s_argv(k8s_container("Job", "load", "load")))
    }
    assert runs_the_clusters_experiment(list(load))


def test_cluster_json_gives_every_node_to_exactly_one_node_host() -> None:
    data = cluster_json()
    assert [d["index"] for d in data["dispatchers"]] == list(range(len(data["dispatchers"])))
    assert [h["index"] for h in data["node_hosts"]] == list(range(len(data["node_hosts"])))
    assert {d["role"] for d in data["dispatchers"]} == {"dispatcher"}
    assert {h["role"] for h in data["node_hosts"]} == {"nodes"}
    ids = sorted(k for h in data["node_hosts"] for k in h["nodes"])
    assert ids == list(range(experiment().n))
    assert "token" not in data, "the token comes from the environment, never from a committed file"
    for e in data["dispatchers"] + data["node_hosts"]:
        u = urlsplit(e["url"])
        assert u.scheme == "http" and u.port and u.path == "", e["url"]


def test_cluster_json_loads_with_the_token_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LBT_TOKEN", "cd" * 16)
    assert ClusterFile.load(CLUSTER_JSON).token == "cd" * 16


# ------------------------------------------------------------------- compose and Kubernetes agree


def test_every_lbtestbed_service_runs_the_image_of_this_version() -> None:
    doc = compose()
    lbt_services = [s for s in doc["services"].values() if s["image"].startswith("lbtestbed:")]
    assert {s["image"] for s in lbt_services} == {image_name()}
    k8s_images = set()
    for w in workloads():
        pod = w["spec"]["template"]["spec"]
        k8s_images |= {c["image"] for c in pod.get("initContainers", []) + pod["containers"]}
    assert {i for i in k8s_images if i.startswith("lbtestbed:")} == {image_name()}
    prometheus = k8s_container("Deployment", "prometheus", "prometheus")["image"]
    assert doc["services"]["prometheus"]["image"] == prometheus


def test_compose_and_k8s_run_the_same_commands() -> None:
    assert compose_argv("dispatcher") == k8s_argv(k8s_container("Deployment", "dispatcher", "dispatcher"))
    for j in range(len(cluster_json()["node_hosts"])):
        assert compose_argv(f"nodes-{j}") == node_argv_k8s(j)
    assert compose_argv("load") == k8s_argv(k8s_container("Job", "load", "load"))
    constants = k8s_container("Deployment", "prometheus", "constants", init=True)
    assert compose_argv("prometheus-constants") == k8s_argv(constants)


def test_k8s_variable_references_name_the_containers_variables() -> None:
    for w in workloads():
        pod = w["spec"]["template"]["spec"]
        for c in pod.get("initContainers", []) + pod["containers"]:
            names = {e["name"] for e in c.get("env", [])}
            used = {m for a in c.get("command", []) + c.get("args", []) for m in K8S_VAR.findall(str(a))}
            assert used <= names, f"{c['name']}: {used - names} would be passed literally"
    (pod_index,) = [
        e for e in k8s_container("StatefulSet", "nodes", "nodes")["env"] if e["name"] == "POD_INDEX"
    ]
    assert (
        pod_index["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.labels['apps.kubernetes.io/pod-index']"
    )


def test_the_lbt_commands_parse_and_target_the_deployment() -> None:
    data = cluster_json()
    for argv in (compose_argv("load"), k8s_argv(k8s_container("Job", "load", "load"))):
        args = parse_lbt(argv)
        assert args.command == "load" and args.spec == data["spec"]
        assert args.dispatcher == [d["url"] for d in data["dispatchers"]]
        assert runs_the_clusters_experiment(args.set), "the load generator must run what the processes do"
    wait = k8s_argv(k8s_container("Job", "load", "wait-for-cluster", init=True))
    statuses = commands_in_script(shell_script(wait), "lbt")
    assert statuses, "the init container must ask lbt whether the cluster is up"
    for argv in statuses:
        args = parse_lbt(argv)
        assert (args.command, args.action, args.file) == ("cluster", "status", mounted_cluster_file())


def mounted_cluster_file() -> str:
    """Where both deployments put cluster.json in the containers."""
    (target,) = [c["target"] for c in compose()["x-lbt"]["configs"] if c["source"] == "lbt-cluster"]
    return str(target)


def test_the_process_commands_parse() -> None:
    from lbtestbed.transport.process import process_parser  # type: ignore[attr-defined]

    data = cluster_json()
    for name, argv in process_argvs().items():
        assert argv[:2] == ["python", "-m"] and argv[2] in PROCESS_MODULES, name
        role = PROCESS_MODULES[argv[2]]
        args = process_parser(argv[2].rsplit(".", 1)[1]).parse_args(argv[3:])
        assert str(args.cluster) == mounted_cluster_file(), name
        me = (data["dispatchers"] if role == "dispatcher" else data["node_hosts"])[args.index]
        assert name.endswith(f"nodes-{args.index}") or role == "dispatcher", name
        host, _, port = args.listen.rpartition(":")
        assert host == "0.0.0.0" and int(port) == urlsplit(me["url"]).port, name


def test_process_indices_and_names_match_cluster_json() -> None:
    data = cluster_json()
    doc = compose()
    (disp,) = data["dispatchers"]
    assert urlsplit(disp["url"]).hostname == k8s_object("Service", "dispatcher")["metadata"]["name"]
    assert (
        urlsplit(disp["url"]).hostname in doc["services"]
        and option(compose_argv("dispatcher"), "--index") == "0"
    )
    deployment = k8s_object("Deployment", "dispatcher")
    assert deployment["spec"]["replicas"] == len(data["dispatchers"])
    assert deployment["spec"]["template"]["metadata"]["labels"]["lbtestbed.io/index"] == "0"
    sts = k8s_object("StatefulSet", "nodes")
    headless = k8s_object("Service", sts["spec"]["serviceName"])
    assert headless["spec"]["clusterIP"] == "None"
    assert sts["spec"]["replicas"] == len(data["node_hosts"])
    node_services = sorted(s for s in doc["services"] if s.startswith("nodes-"))
    assert node_services == [f"nodes-{j}" for j in range(len(data["node_hosts"]))]
    for j, h in enumerate(data["node_hosts"]):
        host = urlsplit(h["url"]).hostname
        # the StatefulSet's pod j under its headless Service, and the compose service's network alias
        assert host == f"{sts['metadata']['name']}-{j}.{headless['metadata']['name']}"
        assert host in doc["services"][f"nodes-{j}"]["networks"]["default"]["aliases"]
        assert option(compose_argv(f"nodes-{j}"), "--index") == str(j)
        assert option(node_argv_k8s(j), "--index") == str(j)
    for svc in (headless, k8s_object("Service", "dispatcher")):
        owner = sts if svc is headless else deployment
        labels = owner["spec"]["template"]["metadata"]["labels"]
        assert svc["spec"]["selector"].items() <= labels.items(), svc["metadata"]["name"]
        assert owner["spec"]["selector"]["matchLabels"].items() <= labels.items()


def container_port(container: dict[str, Any], port: int | str) -> int:
    if isinstance(port, int):
        return port
    (p,) = [p["containerPort"] for p in container["ports"] if p["name"] == port]
    return int(p)


def test_ports_agree_with_where_the_processes_listen() -> None:
    data = cluster_json()
    doc = compose()
    (expose,) = instructions("EXPOSE")
    health = wire.PREFIX + "/health"
    roles = {"dispatcher": ("Deployment", "dispatcher"), "nodes": ("StatefulSet", "nodes")}
    for name, argv in process_argvs().items():
        listen = int(option(argv, "--listen").rpartition(":")[2])
        service = name.split()[1]
        role = "dispatcher" if service == "dispatcher" else "nodes"
        me = data["dispatchers"][0] if role == "dispatcher" else data["node_hosts"][int(service[-1])]
        assert urlsplit(me["url"]).port == listen, name
        assert expose.value == (str(listen),), "the image's EXPOSE"
        if name.startswith("compose"):
            svc = doc["services"][service]
            assert svc["expose"] == [str(listen)]
            probe = svc["healthcheck"]["test"][-1]
            assert f"http://127.0.0.1:{listen}{health}" in probe, name
            for published in svc.get("ports", []):
                host_ip, _, target = published.split(":")
                assert (host_ip, int(target)) == ("127.0.0.1", listen), "publish on the host's loopback only"
        else:
            kind, wname = roles[role]
            w = k8s_object(kind, wname)
            c = k8s_container(kind, wname, wname)
            assert [p["containerPort"] for p in c["ports"]] == [listen]
            for probe in (c["readinessProbe"], c["livenessProbe"]):
                assert probe["httpGet"]["path"] == health
                assert container_port(c, probe["httpGet"]["port"]) == listen
            notes = w["spec"]["template"]["metadata"]["annotations"]
            assert notes["prometheus.io/scrape"] == "true" and int(notes["prometheus.io/port"]) == listen
            assert notes["prometheus.io/path"] == "/metrics"
            svc = k8s_object("Service", "dispatcher" if role == "dispatcher" else w["spec"]["serviceName"])
            (sp,) = svc["spec"]["ports"]
            # peers connect to the URL's port: the Service's port, passed on to the process's
            assert sp["port"] == urlsplit(me["url"]).port and container_port(c, sp["targetPort"]) == listen


def test_the_token_reaches_every_process_and_nothing_else() -> None:
    doc = compose()
    for name, svc in doc["services"].items():
        token = svc.get("environment", {}).get("LBT_TOKEN")
        if name == "dispatcher" or name.startswith("nodes-"):
            assert token is not None and re.fullmatch(r"\$\{LBT_TOKEN:\?[^}]+\}", token), (name, token)
        else:
            assert token is None, f"{name} needs no token"
    for w in workloads():
        pod = w["spec"]["template"]["spec"]
        for c in pod.get("initContainers", []) + pod["containers"]:
            env = {e["name"]: e for e in c.get("env", [])}
            is_process = c["image"] == image_name() and k8s_argv(c)[:3] in (
                ["python", "-m", m] for m in PROCESS_MODULES
            )
            if is_process:
                ref = env["LBT_TOKEN"]["valueFrom"]["secretKeyRef"]
                assert (ref["name"], ref["key"]) == ("lbt-token", "token"), c["name"]
            else:
                assert "LBT_TOKEN" not in env, f"{c['name']} needs no token"


def test_the_commands_read_the_files_the_deployments_mount() -> None:
    data = cluster_json()
    doc = compose()
    targets = {c["source"]: c["target"] for c in doc["x-lbt"]["configs"]}
    sources = {name: (DEPLOY / doc["configs"][name]["file"]).resolve() for name in targets}
    assert sources == {"lbt-spec": SPEC_TOML, "lbt-cluster": CLUSTER_JSON}
    assert targets["lbt-spec"] == data["spec"]
    for name, svc in doc["services"].items():
        if svc["image"] == image_name():
            assert svc["configs"] == doc["x-lbt"]["configs"], name
    # Kubernetes: the ConfigMap of both files, mounted as a directory, gives the same paths
    (gen,) = [g for g in kustomization()["configMapGenerator"] if g["name"] == "lbt-experiment"]
    for w in workloads():
        pod = w["spec"]["template"]["spec"]
        volumes = {v["name"]: v for v in pod["volumes"]}
        for c in pod.get("initContainers", []) + pod["containers"]:
            if c["image"] != image_name():
                continue
            (mount,) = [m for m in c["volumeMounts"] if volumes[m["name"]].get("configMap", {}).get("name")]
            assert volumes[mount["name"]]["configMap"]["name"] == gen["name"]
            paths = {f"{mount['mountPath']}/{Path(f).name}" for f in gen["files"]}
            assert paths == set(targets.values()), c["name"]


# -------------------------------------------------------------------------------------- Prometheus


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.skip("promtool is not installed (make prometheus)")
    return path


def compose_prometheus_config() -> dict[str, Any]:
    return dict(yaml.safe_load(compose()["configs"]["prometheus-config"]["content"]))


def test_compose_prometheus_scrapes_every_process_as_the_local_cluster_does(tmp_path: Path) -> None:
    config = compose_prometheus_config()
    (tmp_path / "prometheus.yml").write_text(compose()["configs"]["prometheus-config"]["content"])
    done = subprocess.run(
        [promtool(), "check", "config", str(tmp_path / "prometheus.yml")], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr
    (job,) = config["scrape_configs"]
    exp = experiment()
    local = lbt_prometheus.server_config([], "targets.json", 1.0)["scrape_configs"][0]
    assert job["job_name"] == local["job_name"] and job["honor_labels"] == local["honor_labels"]
    assert job["static_configs"] == lbt_prometheus.scrape_targets(cluster_file(), exp.name, exp.policy.name)


def seconds(duration: str) -> float:
    m = re.fullmatch(r"(\d+)(ms|s|m)", duration)
    assert m, f"unexpected Prometheus duration {duration}"
    return int(m.group(1)) * {"ms": 1e-3, "s": 1.0, "m": 60.0}[m.group(2)]


def test_both_prometheus_configs_scrape_as_often_as_the_rules_need() -> None:
    """The rules of deploy/prometheus average over short windows: lbtestbed.cluster.prometheus bounds the
    interval."""
    for config in (compose_prometheus_config(), yaml.safe_load((K8S / "prometheus.yml").read_text())):
        interval = seconds(config["global"]["scrape_interval"])
        assert lbt_prometheus.MIN_INTERVAL <= interval <= lbt_prometheus.MAX_INTERVAL
        assert seconds(config["global"]["evaluation_interval"]) == interval


def test_grafana_gets_the_provisioning_with_the_compose_prometheus() -> None:
    """Compose mounts deploy/grafana's dashboards and their provider, and gives the datasource of
    deploy/grafana with the compose Prometheus's URL and scrape interval (the repository's points at
    127.0.0.1, which inside the Grafana container is Grafana itself)."""
    doc = compose()
    svc = doc["services"]["grafana"]
    provisioning = DEPLOY / "grafana" / "provisioning"
    (theirs,) = yaml.safe_load((provisioning / "datasources" / "lbtestbed.yml").read_text())["datasources"]
    (ours,) = yaml.safe_load(doc["configs"]["grafana-datasource"]["content"])["datasources"]
    assert {k: v for k, v in ours.items() if k not in ("url", "jsonData")} == {
        k: v for k, v in theirs.items() if k not in ("url", "jsonData")
    }
    assert {**ours["jsonData"], "timeInterval": None} == {**theirs["jsonData"], "timeInterval": None}
    interval = compose_prometheus_config()["global"]["scrape_interval"]
    assert seconds(ours["jsonData"]["timeInterval"]) == seconds(interval)
    (published,) = doc["services"]["prometheus"]["ports"]
    assert ours["url"] == f"http://prometheus:{published.rsplit(':', 1)[1]}"
    # every provisioning directory is there: mounted from deploy/grafana, or replaced by a config
    targets = {t: DEPLOY / s for s, t in bind_mounts(svc)}
    targets |= {Path(c["target"]).parent.as_posix(): None for c in svc["configs"]}
    for sub in provisioning.iterdir():
        target = f"/etc/grafana/provisioning/{sub.name}"
        assert target in targets, f"grafana misses {sub}"
        assert targets[target] in (None, sub.resolve())
    (provider,) = yaml.safe_load((provisioning / "dashboards" / "lbtestbed.yml").read_text())["providers"]
    assert (targets[provider["options"]["path"]] or Path()).resolve() == (DEPLOY / "grafana" / "dashboards")


def sanitize(name: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_]", "_", name)


def discovered_pods(objects: list[dict[str, Any]], namespace: str) -> list[dict[str, Any]]:
    """File-SD entries carrying the meta labels Prometheus' Kubernetes pod discovery gives the pods of these
    workloads (one target per container port, one port-less target per container without ports; pod IPs
    made up, one IPv6), so that promtool can run the configuration's relabelling on them."""
    entries, ip = [], 10
    for w in (o for o in objects if o["kind"] in ("Deployment", "StatefulSet", "Job")):
        replicas = w["spec"].get("replicas", 1)
        for j in range(replicas):
            ip += 1
            pod_ip = f"10.0.0.{ip}" if ip % 2 else f"fd00::{ip:x}"
            name = f"{w['metadata']['name']}-{j if w['kind'] == 'StatefulSet' else f'x{j}'}"
            labels = dict(w["spec"]["template"]["metadata"].get("labels", {}))
            if w["kind"] == "StatefulSet":
                labels["apps.kubernetes.io/pod-index"] = str(j)
            notes = w["spec"]["template"]["metadata"].get("annotations", {})
            meta = {
                "__meta_kubernetes_namespace": namespace,
                "__meta_kubernetes_pod_name": name,
                "__meta_kubernetes_pod_ip": pod_ip,
                "__meta_kubernetes_pod_phase": "Running",
                **{f"__meta_kubernetes_pod_label_{sanitize(k)}": v for k, v in labels.items()},
                **{f"__meta_kubernetes_pod_annotation_{sanitize(k)}": v for k, v in notes.items()},
            }
            pod = w["spec"]["template"]["spec"]
            for init, containers in ((True, pod.get("initContainers", [])), (False, pod["containers"])):
                for c in containers:
                    host = f"[{pod_ip}]" if ":" in pod_ip else pod_ip
                    for port in c.get("ports", [{}]):
                        address = f"{host}:{port['containerPort']}" if port else pod_ip
                        container_meta = {
                            "__meta_kubernetes_pod_container_name": c["name"],
                            "__meta_kubernetes_pod_container_init": str(init).lower(),
                        }
                        entries.append({"targets": [address], "labels": {**meta, **container_meta}})
    return entries


def test_k8s_prometheus_finds_every_process_by_annotation_and_labels_it_as_locally(tmp_path: Path) -> None:
    """The relabelling of deploy/k8s/prometheus.yml, run by promtool on the pods the manifests make.

    Debian's Prometheus is built without Kubernetes discovery, so the pods come from a file-SD file with
    the meta labels Kubernetes discovery would give them; the relabel rules are the configuration's own.
    """
    config = yaml.safe_load((K8S / "prometheus.yml").read_text())
    (job,) = config["scrape_configs"]
    assert job.pop("kubernetes_sd_configs") == [{"role": "pod", "namespaces": {"own_namespace": True}}]
    pods = discovered_pods(k8s_objects(), "lbt")
    (tmp_path / "pods.json").write_text(json.dumps(pods))
    job["file_sd_configs"] = [{"files": [str(tmp_path / "pods.json")]}]
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    tool = promtool()
    checked = subprocess.run([tool, "check", "config", str(tmp_path / "prometheus.yml")], capture_output=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    done = subprocess.run(
        [
            tool,
            "check",
            "service-discovery",
            "--timeout=5s",
            str(tmp_path / "prometheus.yml"),
            job["job_name"],
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    kept = [t["labels"] for t in json.loads(done.stdout) if t["labels"]]
    got = sorted(
        (sorted((k, t[k]) for k in ("role", "index", "cluster", "policy")), t["__metrics_path__"])
        for t in kept
    )
    exp = experiment()
    want = [
        (sorted(e["labels"].items()), "/metrics")
        for e in lbt_prometheus.scrape_targets(cluster_file(), exp.name, exp.policy.name)
    ]
    assert got == sorted(want)
    # each is scraped at its pod IP (bracketed if IPv6) on the port the process listens on
    by_pod = {
        p["labels"]["__meta_kubernetes_pod_name"]: p["labels"]["__meta_kubernetes_pod_ip"] for p in pods
    }
    for t in kept:
        ip = by_pod[t["pod"]]
        process = t["pod"] if t["role"] == "nodes" else "dispatcher"
        port = option(process_argvs()[f"k8s {process}"], "--listen")
        host = f"[{ip}]" if ":" in ip else ip
        assert t["__address__"] == f"{host}:{port.rpartition(':')[2]}", t
    assert any(":" in by_pod[t["pod"]] for t in kept), "the IPv6 rule went untested"


def rule_globs(config: dict[str, Any]) -> list[str]:
    return list(config["rule_files"])


def test_the_rule_files_land_where_prometheus_reads_rules(tmp_path: Path) -> None:
    """Compose mounts deploy/prometheus's rule files and the constants volume under its rule_files globs;
    Kubernetes mounts the rules ConfigMap and the constants emptyDir there; promtool accepts every file."""
    doc = compose()
    globs = rule_globs(compose_prometheus_config())
    svc = doc["services"]["prometheus"]
    mounted = {target: source for source, target in bind_mounts(svc)}
    assert mounted, "compose mounts no rule files"
    for target in mounted:
        assert any(fnmatch.fnmatch(target, g) for g in globs), f"{target} is outside {globs}"
    # the constants: written by prometheus-constants into the volume that Prometheus mounts
    (script,) = as_list(doc["services"]["prometheus-constants"]["command"]) or []
    written = script.rsplit(">", 1)[1].strip()
    vols = {v.split(":")[0]: v.split(":")[1] for v in doc["services"]["prometheus-constants"]["volumes"]}
    reads = {v.split(":")[0]: v.split(":")[1] for v in svc["volumes"] if not v.startswith(".")}
    (volume,) = [v for v, path in vols.items() if written.startswith(path + "/")]
    landed = reads[volume] + written[len(vols[volume]) :]
    assert any(fnmatch.fnmatch(landed, g) for g in globs), landed
    # Kubernetes: the same file through an emptyDir, the rules through the optional ConfigMap
    k8s_globs = rule_globs(yaml.safe_load((K8S / "prometheus.yml").read_text()))
    init = k8s_container("Deployment", "prometheus", "constants", init=True)
    prom = k8s_container("Deployment", "prometheus", "prometheus")
    k8s_written = shell_script(k8s_argv(init)).rsplit(">", 1)[1].strip()
    (init_mount,) = [m for m in init["volumeMounts"] if k8s_written.startswith(m["mountPath"] + "/")]
    (prom_mount,) = [m for m in prom["volumeMounts"] if m["name"] == init_mount["name"]]
    k8s_landed = prom_mount["mountPath"] + k8s_written[len(init_mount["mountPath"]) :]
    assert any(fnmatch.fnmatch(k8s_landed, g) for g in k8s_globs), k8s_landed
    (rules_mount,) = [m for m in prom["volumeMounts"] if m["name"] == "rules"]
    assert any(fnmatch.fnmatch(rules_mount["mountPath"] + "/x.yml", g) for g in k8s_globs)
    # promtool accepts every rule file the deployments load, the constants as the command writes them
    files = [DEPLOY / source for source in mounted.values()]
    out = io.StringIO()
    words = shlex.split(script.rsplit(">", 1)[0])
    assert words[:4] == ["python", "-m", "lbtestbed.cluster.prometheus", "constants"]
    assert runs_the_clusters_experiment([words[i + 1] for i, w in enumerate(words) if w == "--set"])
    args = [str(SPEC_TOML) if w == cluster_json()["spec"] else w for w in words[4:]]
    with redirect_stdout(out):
        assert lbt_prometheus.main(["constants", *args]) == 0
    (tmp_path / "constants.yml").write_text(out.getvalue())
    files.append(tmp_path / "constants.yml")
    done = subprocess.run([promtool(), "check", "rules", *map(str, files)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


# ----------------------------------------------------------------------------- the commands run


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}{wire.PREFIX}/health", timeout=1.0) as r:
            return bool(r.status == 200)
    except OSError:
        return False


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=5)


def test_the_manifests_commands_run_an_experiment_on_loopback(
    tmp_path: Path, processes: list[subprocess.Popen[bytes]]
) -> None:
    """The Kubernetes commands (the compose ones are the same, see above), each host on its own loopback
    address: node hosts, dispatcher, the load Job's wait-for-cluster script, then its load, cut to 20 model
    seconds. Only names, addresses, mounted paths and programs are translated; the arguments are the
    manifests'."""
    data = cluster_json()
    hosts = {}  # deployment netloc -> loopback netloc
    for i, e in enumerate(data["dispatchers"] + data["node_hosts"]):
        address = f"127.0.0.{i + 2}"
        hosts[urlsplit(e["url"]).netloc] = f"{address}:{free_port(address)}"
    local = copy.deepcopy(data)
    local["spec"] = str(SPEC_TOML)
    for e in local["dispatchers"] + local["node_hosts"]:
        e["url"] = "http://" + hosts[urlsplit(e["url"]).netloc]
    (tmp_path / "cluster.json").write_text(json.dumps(local))
    bin_dir = Path(sys.executable).parent
    paths = {data["spec"]: str(SPEC_TOML), mounted_cluster_file(): str(tmp_path / "cluster.json")}

    def translate(argv: list[str], me: str | None = None) -> list[str]:
        out = []
        for a in argv:
            for old, new in paths.items():
                a = a.replace(old, new)
            for old, new in hosts.items():
                a = a.replace(f"http://{old}", f"http://{new}")
            if me is not None and re.fullmatch(r"0\.0\.0\.0:\d+", a):
                a = hosts[me]  # "every interface" becomes the host's own loopback address
            out.append(a)
        if out[0] == "python":
            out[0] = sys.executable
        return out

    env = {k: v for k, v in os.environ.items() if k != "LBT_TOKEN"}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    token_env = {**env, "LBT_TOKEN": "ef" * 16}
    starts = [(node_argv_k8s(j), urlsplit(h["url"]).netloc) for j, h in enumerate(data["node_hosts"])]
    dispatcher = k8s_argv(k8s_container("Deployment", "dispatcher", "dispatcher"))
    starts.append((dispatcher, urlsplit(data["dispatchers"][0]["url"]).netloc))
    for argv, me in starts:
        with open(tmp_path / f"{me}.log", "wb") as log:
            processes.append(
                subprocess.Popen(
                    translate(argv, me),
                    env=token_env,
                    cwd=tmp_path,  # like the image's working directory: no source tree to import from
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                )
            )

    def logs() -> str:
        return " | ".join(f"{p.name}: {p.read_text()[-300:]}" for p in tmp_path.glob("*.log"))

    deadline = time.monotonic() + 60
    while not all(healthy("http://" + h) for h in hosts.values()):
        exited = [p.args for p in processes if p.poll() is not None]
        assert not exited, f"exited at start: {exited}: {logs()}"
        assert time.monotonic() < deadline, f"not healthy after 60 s: {logs()}"
        time.sleep(0.1)
    # the load Job's init container must see the cluster as up, from the cluster file alone
    wait = translate(k8s_argv(k8s_container("Job", "load", "wait-for-cluster", init=True)))
    waited = subprocess.run(wait, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert waited.returncode == 0, f"the wait script does not see the cluster: {waited.stdout}{waited.stderr}"
    load = [*translate(k8s_argv(k8s_container("Job", "load", "load"))), "--duration", "20"]
    done = subprocess.run(load, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=180)
    summary = json.loads(done.stdout)
    assert done.returncode == 0 and summary["completed"] == summary["scheduled"] > 0, (summary, logs())
    # every process serves its metrics where the prometheus.io annotations say
    for kind, name in (("StatefulSet", "nodes"), ("Deployment", "dispatcher")):
        path = k8s_object(kind, name)["spec"]["template"]["metadata"]["annotations"]["prometheus.io/path"]
        for netloc in hosts.values():
            with urllib.request.urlopen(f"http://{netloc}{path}", timeout=5) as r:
                assert b"lbtestbed_" in r.read()
