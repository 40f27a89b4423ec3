"""A real Prometheus server for a local cluster: its configuration, its process, and queries to it.

``start_prometheus`` writes a directory next to the cluster file (``cluster.json`` -> ``cluster.prometheus/``)
and starts ``prometheus`` there as a subprocess in its own session, on a free loopback port, then waits
until the server at that port is ready *and is the one it started* (``serves``): our process alive and
listening on the port, and the server's own flags naming our configuration file and database. A port
held by another Prometheus (another cluster's) answers ``/-/ready`` too; without that check the new
cluster would read the other's data. The directory holds:

- ``targets.json``: file-based service discovery, one entry per dispatcher and node host, labelled with
  ``role``, ``index``, ``cluster`` (the spec's name) and ``policy``;
- ``generators/``: one more discovery file per load generator running against the cluster (``lbt load``,
  ``lbt run``), ``<pid>.json``, which the generator writes when its ``/metrics`` serves and removes when
  it ends (``register_generator``, ``serve_generator``): role ``loadgen``, index its pid;
- ``prometheus.yml``: scrape and rule-evaluation interval, the discovery file, the rule files;
- the rule files of ``deploy/prometheus`` (copied, so that the running server does not change under edits);
- ``constants.yml``: recording rules that hold constants PromQL cannot compute: the spec's arrival rate
  and what ``lbt predict`` says about the spec (occupancy tails per class, the utility bound u(q*), r*, ...),
  so that dashboards can set measured against predicted;
- ``data/`` (the TSDB, emptied at every start: one directory is one run) and ``prometheus.log``.

``instant_query``, ``range_samples`` and ``wait_for_series`` read the server over its HTTP API.
``python -m lbtestbed.cluster.prometheus constants SPEC`` prints the constants file for deployments that run
their own Prometheus (compose, Kubernetes).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil

from lbtestbed.cluster.processes import Started, free_ports, stop_all
from lbtestbed.model.experiment import Experiment
from lbtestbed.model.reader import SpecError
from lbtestbed.policies import CATALOG
from lbtestbed.spec import load_spec
from lbtestbed.transport.cluster_file import LOOPBACK, ClusterFile
from lbtestbed.transport.metrics import sojourn_buckets

#: the rule files of the repository, loaded by every server this module starts
RULES_DIR = Path(__file__).resolve().parents[2] / "deploy" / "prometheus"
RULE_FILES = ("recording_rules.yml", "alerting_rules.yml")
CONSTANTS_FILE = "constants.yml"
GENERATORS = "generators"  # the directory of the load generators' discovery files
#: the port of deploy/grafana's provisioned datasource: `lbt cluster up --with-prometheus` takes it when free
GRAFANA_PORT = 9090
DISCOVERY_DELAY = 5.0  # seconds: Prometheus passes discovered target changes on at most this often
JOB = "lbtestbed"
#: the recording rules average over 1 min and the alerts over 20 s: an interval above 10 s leaves too few
#: samples in a window; every scrape costs the measured processes CPU, so none faster than 0.1 s
MIN_INTERVAL, MAX_INTERVAL = 0.1, 10.0
INSTALL_HINT = (
    "install it with `make prometheus` (Debian/Ubuntu: apt-get install prometheus) or put it on PATH"
)

if TYPE_CHECKING:  # numpy and the generator are imported only by the commands that serve its metrics
    from lbtestbed.loadgen.metrics import MetricsServer
    from lbtestbed.loadgen.openloop import LoadReport

Labels = dict[str, str]


class PrometheusError(RuntimeError):
    """Prometheus could not be started, reached or queried; the message says what and where."""


# ------------------------------------------------------------------------------------ configuration


def duration(seconds: float) -> str:
    """A Prometheus duration in whole milliseconds (``1500ms``): exact for any interval we accept."""
    return f"{round(seconds * 1000)}ms"


def scrape_targets(cluster: ClusterFile, name: str, policy: str) -> list[dict[str, Any]]:
    """The file-SD entries: one per process, so that each carries its own role and index."""
    entries = []
    for e in cluster.dispatchers + cluster.node_hosts:
        address = urllib.parse.urlsplit(e.url).netloc
        labels = {"role": e.role, "index": str(e.index), "cluster": name, "policy": policy}
        entries.append({"targets": [address], "labels": labels})
    return entries


def server_config(rule_files: Sequence[str], targets_file: str, scrape_interval: float) -> dict[str, Any]:
    interval = duration(scrape_interval)
    return {
        "global": {
            "scrape_interval": interval,
            "scrape_timeout": interval,  # Prometheus requires timeout <= interval
            # the rules average over 1 min: evaluating them more than once a second costs CPU the
            # cluster needs (short scrape intervals serve lbt run's exact snapshots, not the rules)
            "evaluation_interval": duration(max(scrape_interval, 1.0)),
        },
        "rule_files": list(rule_files),
        "scrape_configs": [
            {
                "job_name": JOB,
                # the dispatcher exports its own `policy` label on decisions_total, with the same value as
                # the target's; without honor_labels Prometheus would rename it to exported_policy
                "honor_labels": True,
                # the cluster's processes, and the load generators that register themselves (file
                # changes are seen at once: Prometheus watches the directories)
                "file_sd_configs": [
                    {"files": [targets_file, f"{GENERATORS}/*.json"], "refresh_interval": "5s"}
                ],
            }
        ],
    }


def constant_rules(exp: Experiment, name: str) -> dict[str, Any]:
    """Recording rules holding the spec's arrival rate and the theory's predictions for it.

    Every series carries ``cluster`` and ``policy``. A prediction that theory leaves null (``lbt predict``
    says why) has no series, so a dashboard shows the measurement alone.
    """
    from lbtestbed.analysis.theory import predict

    base = {"cluster": name, "policy": exp.policy.name}
    values: list[tuple[str, Any, Labels]] = [("lbtestbed:spec:arrival_rate", exp.workload.arrival_rate, base)]
    values += [("lbtestbed:spec:nodes", c.count, {**base, "class": c.name}) for c in exp.classes]
    result = predict(exp).to_json()
    for metric, entry in result["metrics"].items():
        if metric == "occupancy_tail":  # {class: [{value, ci95} for k = 0, 1, ...]}
            for cls, tail in entry.items() if isinstance(entry, dict) else ():
                for k, point in enumerate(tail if isinstance(tail, list) else ()):
                    labels = {**base, "class": cls, "tasks": str(k)}
                    values.append(("lbtestbed:predicted:occupancy_tail", point["value"], labels))
        elif isinstance(entry, dict):
            values.append((f"lbtestbed:predicted:{metric}", entry.get("value"), base))
    values.append(("lbtestbed:predicted:utility_bound", result.get("bounds", {}).get("utility_upper"), base))
    for learned in CATALOG.learned():  # the value a learned quantity should settle at
        values.append(
            (f"lbtestbed:predicted:{learned.name}_star", result["metrics"][learned.name]["value"], base)
        )
    rules = [
        {"record": record, "expr": f"vector({float(v)!r})", "labels": labels}
        for record, v, labels in values
        if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
    ]
    return {"groups": [{"name": "lbtestbed_constants", "rules": rules}]}


def write_config(
    exp: Experiment, cluster: ClusterFile, directory: Path, scrape_interval: float, name: str | None = None
) -> Path:
    """Write every file the server reads into ``directory``; returns the configuration file."""
    if not MIN_INTERVAL <= scrape_interval <= MAX_INTERVAL:
        raise PrometheusError(
            f"scrape interval {scrape_interval:g} s: must be between {MIN_INTERVAL:g} and {MAX_INTERVAL:g} s"
        )
    name = name or exp.name
    directory.mkdir(parents=True, exist_ok=True)
    rule_files = []
    for rules in RULE_FILES:
        source = RULES_DIR / rules
        if not source.is_file():
            raise PrometheusError(f"{source}: rule file missing (lbtestbed runs from its source tree)")
        shutil.copyfile(source, directory / rules)
        rule_files.append(rules)
    # JSON is YAML: no YAML library needed at run time
    (directory / CONSTANTS_FILE).write_text(json.dumps(constant_rules(exp, name), indent=1))
    rule_files.append(CONSTANTS_FILE)
    shutil.rmtree(directory / GENERATORS, ignore_errors=True)  # left by a generator that was killed
    (directory / GENERATORS).mkdir()
    (directory / "targets.json").write_text(
        json.dumps(scrape_targets(cluster, name, exp.policy.name), indent=1)
    )
    config = directory / "prometheus.yml"
    config.write_text(json.dumps(server_config(rule_files, "targets.json", scrape_interval), indent=1))
    return config


# ------------------------------------------------------------------------------ load generators


def register_generator(directory: Path, address: str, index: int) -> Path | None:
    """Add a load generator serving ``/metrics`` at ``address`` (host:port) to the targets of the
    Prometheus configured in ``directory`` (``config_dir``), labelled as the cluster's processes are, with
    role ``loadgen`` and ``index`` (its pid); returns the discovery file to remove at its end, or None when
    no Prometheus is configured there."""
    targets = directory / "targets.json"
    try:
        entries = json.loads(targets.read_text())
    except (OSError, ValueError):
        return None
    shared = {
        k: v for k, v in (entries[0]["labels"] if entries else {}).items() if k in ("cluster", "policy")
    }
    labels = {"role": "loadgen", "index": str(index), **shared}
    path = directory / GENERATORS / f"{index}.json"
    path.parent.mkdir(exist_ok=True)
    part = path.with_suffix(".part")  # not *.json: Prometheus never reads a half-written file
    part.write_text(json.dumps([{"targets": [address], "labels": labels}], indent=1))
    part.replace(path)
    return path


def scrape_interval_of(directory: Path) -> float:
    """The scrape interval of the configuration in ``directory`` (1 s if it cannot be read)."""
    try:
        text = json.loads((directory / "prometheus.yml").read_text())["global"]["scrape_interval"]
        return int(text.removesuffix("ms")) / 1000
    except (OSError, ValueError, KeyError, TypeError):
        return 1.0


@contextlib.contextmanager
def serve_generator(
    report: LoadReport,
    exp: Experiment,
    port: int | None,
    directory: Path | None,
    say: Callable[[str], None],
    linger: bool = True,
) -> Iterator[MetricsServer | None]:
    """Serve a generator's metrics (``loadgen.metrics``) while it runs and register it with the
    Prometheus configured in ``directory`` (a cluster's, or None).

    ``port`` None serves only when there is a Prometheus to scrape it (on a free port); 0 is a free port.
    At the end, a registered generator waits for one more scrape (at most two intervals and a second), so
    that Prometheus holds its final counts, then leaves the targets and serves until Prometheus has
    stopped scraping it (up to ``DISCOVERY_DELAY`` more seconds; not with ``linger`` False, for a
    Prometheus about to stop). More collectors may join the server's ``registry`` while it serves
    (``lbt run``'s faults). OSError when the port cannot be bound."""
    from lbtestbed.loadgen.metrics import LoadCollector, MetricsServer, registry_for

    scraped = directory is not None and (directory / "targets.json").is_file()
    if port is None and not scraped:
        yield None
        return
    collector = LoadCollector(report, exp.run.time_scale, sojourn_buckets(exp))
    registry = registry_for(collector)
    with MetricsServer(registry, port or 0, LOOPBACK) as server:
        target = register_generator(directory, server.address, os.getpid()) if directory and scraped else None
        where = f", scraped by the cluster's Prometheus ({target.name})" if target else ""
        say(f"generator metrics: {server.url}{where}")
        try:
            yield server
        finally:
            if target is not None and directory is not None:
                interval = scrape_interval_of(directory)
                collector.wait_for_scrape(time.monotonic(), 2 * interval + 1.0)
                target.unlink(missing_ok=True)
                # Prometheus passes changes of its targets on at most every 5 s: serve until it stops
                # scraping, so that its last sample of `up` is not a failed scrape of a closed port
                if linger:
                    collector.wait_until_unscraped(2 * interval + 0.5, DISCOVERY_DELAY + 2 * interval + 1.0)


# ---------------------------------------------------------------------------------------- process


def prometheus_binary() -> str:
    found = shutil.which("prometheus")
    if found is None:
        raise PrometheusError(f"the prometheus binary is not on PATH: {INSTALL_HINT}")
    return found


def config_dir(cluster_path: Path) -> Path:
    """``.lbt/cluster.json`` -> ``.lbt/cluster.prometheus``: one directory per cluster file."""
    return cluster_path.with_suffix(".prometheus")


class PrometheusServer:
    """A running Prometheus; ``stop()`` (or leaving the ``with`` block) ends it and leaves no process."""

    def __init__(
        self, url: str, started: Started, directory: Path, proc: subprocess.Popen[bytes] | None = None
    ):
        self.url, self.started, self.directory, self.proc = url, started, directory, proc
        self.pid = started.pid

    def stop(self, grace: float = 5.0) -> bool:
        """SIGTERM (it closes its database), then SIGKILL after ``grace`` seconds; True when it was still
        running."""
        was_running = stop_all([self.started], grace) > 0
        if self.proc is not None:
            self.proc.wait()  # reap our child
        return was_running

    def __enter__(self) -> PrometheusServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/-/ready", timeout=1.0) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


#: the flags that make a Prometheus server ours: what it reads, where it stores and where it listens
IDENTITY_FLAGS = ("config.file", "storage.tsdb.path", "web.listen-address")


def flags_of(cmdline: Sequence[str]) -> dict[str, str]:
    """The ``--name=value`` flags of a Prometheus command line, by name."""
    pairs = (arg[2:].partition("=") for arg in cmdline if arg.startswith("--"))
    return {name: value for name, _, value in pairs}


def listens_on(pid: int, port: int) -> bool:
    """Whether process ``pid`` holds a listening TCP socket on ``port`` (ours, so readable unprivileged)."""
    try:
        conns = psutil.Process(pid).net_connections(kind="tcp")
    except psutil.Error:
        return False
    return any(c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port for c in conns)


def serves(url: str, started: Started) -> bool:
    """Whether the Prometheus answering at ``url`` is the process ``started`` records: that process is
    alive and listens on the URL's port, and the answering server's flags (``/api/v1/status/flags``) name
    the configuration file, database and address of its command line. Another cluster's server on the
    port fails the last test even when our process is alive (before it gives up on the taken port)."""
    port = urllib.parse.urlsplit(url).port
    if port is None or not started.ours() or not listens_on(started.pid, port):
        return False
    try:
        answered = api_get(url, "/api/v1/status/flags", {}, "flags")
    except PrometheusError:
        return False
    ours = flags_of(started.cmdline)
    return isinstance(answered, dict) and all(answered.get(k) == ours.get(k) for k in IDENTITY_FLAGS)


def start_prometheus(
    exp: Experiment,
    cluster: ClusterFile,
    cluster_path: Path,
    scrape_interval: float = 1.0,
    *,
    name: str | None = None,
    port: int | None = None,
    timeout: float = 30.0,
    prefer: int | None = None,
) -> PrometheusServer:
    """Configure and start a Prometheus for ``cluster`` (running ``exp``) and wait until it is ready.

    ``name`` is the ``cluster`` label (default: the spec's name); ``port`` a fixed port (default: a free
    one, chosen again if another process takes it before Prometheus binds it); ``prefer`` a port to try
    first when no ``port`` is given and it is free (``lbt cluster up``: ``GRAFANA_PORT``).
    """
    binary = prometheus_binary()
    directory = config_dir(Path(cluster_path))
    config = write_config(exp, cluster, directory, scrape_interval, name)
    data = directory / "data"
    shutil.rmtree(data, ignore_errors=True)  # one directory is one run
    log_path = directory / "prometheus.log"
    for attempt in range(1 if port else 3):
        preferred = prefer if attempt == 0 and prefer and port_free(prefer) else None
        listen = port or preferred or free_ports(1)[0]
        url = f"http://{LOOPBACK}:{listen}"
        command = [
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={data}",
            f"--web.listen-address={LOOPBACK}:{listen}",
            "--storage.tsdb.retention.time=7d",
        ]
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                command,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # its own process group: stopped by pid, outlives `lbt cluster up`
            )
        server = PrometheusServer(url, Started.of(proc.pid, command), directory, proc)
        try:
            if _wait_ready(server, log_path, timeout):
                return server
        except BaseException:
            server.stop()
            raise
        server.stop()  # lost the port to another process: try another one
        if port:
            raise PrometheusError(
                f"prometheus could not listen on {LOOPBACK}:{port}: another process holds it (log {log_path})"
            )
    raise PrometheusError(f"prometheus could not bind a loopback port (log: {log_path})")


def port_free(port: int) -> bool:
    """Whether nothing listens on the loopback ``port`` now."""
    with socket.socket() as s:
        try:
            s.bind((LOOPBACK, port))
        except OSError:
            return False
    return True


def _wait_ready(server: PrometheusServer, log_path: Path, timeout: float) -> bool:
    """True when our server is ready at its URL (``serves``), False when it exited because its port was
    taken; else a PrometheusError. A ready server that is not ours is another's on the port: ours exits
    on the taken address, which this sees."""
    deadline = time.monotonic() + timeout
    while not (ready(server.url) and serves(server.url, server.started)):
        if server.proc is not None and server.proc.poll() is not None:
            text = log_path.read_text(errors="replace")
            if "address already in use" in text:
                return False
            tail = " | ".join(line.strip() for line in text.strip().splitlines()[-3:])
            raise PrometheusError(f"prometheus exited at start (log {log_path}): {tail}")
        if time.monotonic() > deadline:
            raise PrometheusError(
                f"prometheus at {server.url} not ready after {timeout:g} s (log {log_path})"
            )
        time.sleep(0.1)
    return True


# ---------------------------------------------------------------------------------------- queries


def api_get(url: str, path: str, params: dict[str, Any], what: str) -> Any:
    """The ``data`` of a Prometheus API answer; ``what`` names the request in errors."""
    query = urllib.parse.urlencode(params, doseq=True)
    try:
        with urllib.request.urlopen(f"{url}{path}?{query}", timeout=30) as resp:
            body = json.loads(resp.read())
    except urllib.error.HTTPError as e:  # 400 bad query, 422 cannot execute, 503 timeout
        try:
            detail = json.loads(e.read()).get("error", e.reason)
        except ValueError:
            detail = e.reason
        raise PrometheusError(f"{what}: {detail}") from None
    except (urllib.error.URLError, OSError, ValueError) as e:
        raise PrometheusError(f"{what}: Prometheus at {url} unreachable ({e})") from None
    if body.get("status") != "success":
        raise PrometheusError(f"{what}: {body.get('error', 'no error text')}")
    return body["data"]


def instant_query(url: str, expr: str, at: float | None = None) -> list[tuple[Labels, float]]:
    """``expr`` at Unix time ``at`` (default now): (labels, value) per series; a scalar is ({}, v)."""
    params: dict[str, Any] = {"query": expr}
    if at is not None:
        params["time"] = f"{at:.3f}"
    data = api_get(url, "/api/v1/query", params, f"query {expr!r}")
    if data["resultType"] in ("scalar", "string"):
        return [({}, float(data["result"][1]))]
    if data["resultType"] != "vector":
        raise PrometheusError(f"query {expr!r}: a range vector; use range_samples for raw samples")
    return [(dict(r["metric"]), float(r["value"][1])) for r in data["result"]]


def range_samples(
    url: str, selector: str, end: float, seconds: float
) -> list[tuple[Labels, list[tuple[float, float]]]]:
    """The raw samples of ``selector`` in (end - seconds, end], with their scrape timestamps."""
    expr = f"{selector}[{duration(seconds)}]"
    data = api_get(url, "/api/v1/query", {"query": expr, "time": f"{end:.3f}"}, f"query {expr!r}")
    return [(dict(r["metric"]), [(float(t), float(v)) for t, v in r["values"]]) for r in data["result"]]


def wait_for_series(
    url: str, expr: str, timeout: float = 30.0, at: float | None = None
) -> list[tuple[Labels, float]]:
    """Poll ``expr`` until it returns at least one series (the first scrapes take a few seconds)."""
    deadline = time.monotonic() + timeout
    while True:
        found = instant_query(url, expr, at)
        if found:
            return found
        if time.monotonic() > deadline:
            raise PrometheusError(f"query {expr!r}: no series after {timeout:g} s at {url}")
        time.sleep(0.25)


# ------------------------------------------------------------------------------------------- CLI


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m lbtestbed.cluster.prometheus constants SPEC``: the constants rule file, for other
    deployments."""
    parser = argparse.ArgumentParser(
        prog="python -m lbtestbed.cluster.prometheus",
        description="Print the recording rules that hold a spec's arrival rate and its predictions.",
    )
    parser.add_argument("action", choices=("constants",))
    parser.add_argument("spec", help="experiment spec (TOML)")
    parser.add_argument("--name", help="the `cluster` label (default: the spec's name)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a value")
    args = parser.parse_args(argv)
    try:
        exp = load_spec(args.spec, args.set)
    except SpecError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    json.dump(constant_rules(exp, args.name or exp.name), sys.stdout, indent=1)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
