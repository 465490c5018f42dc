"""deploy/kubernetes and deploy/docker-compose: the examples hold together where a user would break them.

The daemon's settings pass `kafka-sidecar check-config`; every client names the daemon's socket as it is mounted
in its own container; the clients are in the group that owns the sockets; the daemon sees its clients' real
pids, has time to send what is queued when stopped, and serves its metrics where the scraper looks; the
applications' programs produce through a real daemon. No cluster or container engine runs here: the
manifests are read, not applied.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path, PurePosixPath
from typing import Any

import pytest

from tests.support import users
from tests.support.waiting import wait_until

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
KUBERNETES = DEPLOY / "kubernetes"
COMPOSE = DEPLOY / "docker-compose"


def check_config(config: Path, environment: dict[str, str] | None = None) -> dict[str, tuple[str, str]]:
    """`kafka-sidecar check-config`'s view of the settings: name -> (value, where it came from)."""
    clean = {name: value for name, value in os.environ.items() if not name.startswith("KAFKA_SIDECAR_")}
    result = subprocess.run([sys.executable, "-m", "service.cli", "check-config", "--config", str(config)],
                            env={**clean, **(environment or {})}, capture_output=True, text=True, cwd=users.ROOT,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    assert "ignored" not in result.stderr, result.stderr  # a variable of the prefix that names no setting
    settings = {}
    for line in result.stdout.splitlines():
        setting, _, origin = line.partition("  # ")
        name, _, value = setting.partition(" = ")
        settings[name] = (value, origin)
    return settings


def socket_path(endpoint: str) -> PurePosixPath:
    assert endpoint.startswith("ipc://"), endpoint
    return PurePosixPath(endpoint.removeprefix("ipc://"))


@pytest.fixture(scope="module")
def settings() -> dict[str, str]:
    """The daemon's settings in Kubernetes (the ConfigMap's file), as the daemon reads them."""
    checked = check_config(KUBERNETES / "kafka-sidecar.toml")
    for name in ("bootstrap.servers", "sidecar.endpoint", "sidecar.socket.group", "sidecar.socket.mode",
                 "sidecar.close.timeout.ms", "sidecar.metrics.port", "sidecar.metrics.host"):
        assert checked[name][1] == "file", name
    return {name: value for name, (value, _) in checked.items()}


def test_the_daemonsets_settings_pass_check_config(settings) -> None:
    # The metrics on the pod's address, where Prometheus scrapes them; the sockets the group's to use.
    assert settings["sidecar.metrics.host"] == "0.0.0.0"
    assert int(settings["sidecar.socket.mode"], 8) & 0o060 == 0o060


def test_the_image_is_built_from_what_its_ignore_file_lets_through() -> None:
    ignored = (COMPOSE / "Dockerfile.dockerignore").read_text().split()
    sources = [source for line in (COMPOSE / "Dockerfile").read_text().splitlines()
               if line.startswith("COPY ") and "--from=" not in line for source in line.split()[1:-1]]
    assert sources
    for source in sources:
        assert "!" + source.rstrip("/") in [entry.rstrip("/") for entry in ignored], source


# What follows reads the manifests: YAML.


@pytest.fixture(scope="module")
def yaml() -> Any:
    return pytest.importorskip("yaml", reason="PyYAML reads the manifests")


def load(yaml: Any, path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def pod_spec(document: dict[str, Any]) -> dict[str, Any]:
    """The pod of a Pod, or of a workload's template."""
    return document["spec"] if document["kind"] == "Pod" else document["spec"]["template"]["spec"]


def host_path(pod: dict[str, Any], container: dict[str, Any], path: PurePosixPath) -> PurePosixPath:
    """Where ``path`` of ``container``'s file system is on the node, through a hostPath volume it mounts."""
    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    for mount in container["volumeMounts"]:
        mounted = PurePosixPath(mount["mountPath"])
        if path.is_relative_to(mounted) and "hostPath" in volumes[mount["name"]]:
            return PurePosixPath(volumes[mount["name"]]["hostPath"]["path"]) / path.relative_to(mounted)
    raise AssertionError(f"{container['name']} does not mount {path} from the node")


def environment(container: dict[str, Any]) -> dict[str, str]:
    return {variable["name"]: variable["value"] for variable in container.get("env", [])}


@pytest.fixture(scope="module")
def daemonset(yaml) -> dict[str, Any]:
    return load(yaml, KUBERNETES / "kafka-sidecar-daemonset.yaml")


@pytest.fixture(scope="module")
def clients(yaml) -> dict[str, dict[str, Any]]:
    """The pods that produce through the daemon: the application and the Spark executors."""
    return {name: load(yaml, KUBERNETES / name) for name in ("producer-app.yaml", "spark-executor-pod-template.yaml")}


def daemon_container(daemonset: dict[str, Any]) -> dict[str, Any]:
    (container,) = pod_spec(daemonset)["containers"]
    return container


def test_every_client_names_the_daemons_socket_as_mounted_in_its_own_container(daemonset, clients, settings) -> None:
    daemon_socket = host_path(pod_spec(daemonset), daemon_container(daemonset),
                              socket_path(settings["sidecar.endpoint"]))
    for name, client in clients.items():
        pod = pod_spec(client)
        container = pod["containers"][0]  # Spark's executor is the template's first container
        endpoint = environment(container)["KAFKA_SIDECAR_ENDPOINT"]
        assert host_path(pod, container, socket_path(endpoint)) == daemon_socket, name


def test_the_daemon_runs_in_the_sockets_group_and_every_client_is_in_it(daemonset, clients, settings) -> None:
    pod = pod_spec(daemonset)
    group = int(settings["sidecar.socket.group"])
    assert pod["securityContext"]["runAsGroup"] == group
    for name, client in clients.items():
        assert group in pod_spec(client)["securityContext"]["supplementalGroups"], name
    # The socket directory, made root's by the kubelet, is given to the daemon's user and group first.
    (prepare,) = pod["initContainers"]
    assert f"chown {pod['securityContext']['runAsUser']}:{group} " in " ".join(prepare["command"])
    assert host_path(pod, prepare, PurePosixPath(prepare["volumeMounts"][0]["mountPath"])) == host_path(
        pod, daemon_container(daemonset), socket_path(settings["sidecar.endpoint"]).parent)


def test_the_daemon_sees_its_clients_real_pids(daemonset) -> None:
    # SO_PEERCRED gives pid 0 for a process outside the daemon's pid namespace: every other pod's.
    assert pod_spec(daemonset)["hostPID"] is True


def test_the_daemon_has_time_to_send_what_is_queued_when_stopped(daemonset, settings) -> None:
    assert pod_spec(daemonset)["terminationGracePeriodSeconds"] * 1000 > int(settings["sidecar.close.timeout.ms"])


def test_one_daemon_at_a_time_on_a_node(daemonset) -> None:
    # A second daemon on the socket is refused: an update must not start the new pod beside the old.
    assert daemonset["spec"]["updateStrategy"]["rollingUpdate"].get("maxSurge", 0) == 0


def test_the_metrics_are_served_where_the_annotations_say(daemonset, settings) -> None:
    annotations = daemonset["spec"]["template"]["metadata"]["annotations"]
    port = settings["sidecar.metrics.port"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == port
    assert [p["containerPort"] for p in daemon_container(daemonset)["ports"]] == [int(port)]


def test_the_probes_ask_the_daemon_at_its_endpoint(daemonset, settings) -> None:
    container = daemon_container(daemonset)
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["exec"]["command"] == ["kafka-sidecar", "stats", "--endpoint",
                                                       settings["sidecar.endpoint"]], probe


def test_the_daemon_reads_the_configmap_kustomize_makes_of_the_settings(yaml, daemonset) -> None:
    pod, container = pod_spec(daemonset), daemon_container(daemonset)
    config = PurePosixPath(container["args"][container["args"].index("--config") + 1])
    (generated,) = load(yaml, KUBERNETES / "kustomization.yaml")["configMapGenerator"]
    assert generated["files"] == [config.name] == ["kafka-sidecar.toml"]
    (mount,) = [m for m in container["volumeMounts"] if PurePosixPath(m["mountPath"]) == config.parent]
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert volume["configMap"]["name"] == generated["name"]


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl renders the kustomization")
def test_kubectl_renders_the_kustomization(yaml) -> None:
    result = subprocess.run(["kubectl", "kustomize", str(KUBERNETES)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    rendered = {document["kind"]: document for document in yaml.safe_load_all(result.stdout)}
    volumes = pod_spec(rendered["DaemonSet"])["volumes"]
    # The generated name carries a hash of the settings, and the DaemonSet follows it.
    assert {v["configMap"]["name"] for v in volumes if "configMap" in v} == {rendered["ConfigMap"]["metadata"]["name"]}
    assert rendered["ConfigMap"]["data"]["kafka-sidecar.toml"] == (KUBERNETES / "kafka-sidecar.toml").read_text()


@pytest.fixture(scope="module")
def compose(yaml) -> dict[str, Any]:
    return load(yaml, COMPOSE / "compose.yaml")


def volume_mount(service: dict[str, Any], path: PurePosixPath) -> tuple[str, PurePosixPath]:
    """The named volume ``path`` of a compose service is in, and its place there."""
    for entry in service["volumes"]:
        source, target = entry.split(":")[:2]
        if path.is_relative_to(target):
            return source, path.relative_to(target)
    raise AssertionError(f"nothing is mounted at {path}")


def test_compose_sidecar_and_app_share_the_socket_volume(compose) -> None:
    sidecar, app = compose["services"]["sidecar"], compose["services"]["app"]
    served = volume_mount(sidecar, socket_path(sidecar["environment"]["KAFKA_SIDECAR_ENDPOINT"]))
    assert volume_mount(app, socket_path(app["environment"]["KAFKA_SIDECAR_ENDPOINT"])) == served
    assert served[0] in compose["volumes"]
    assert sidecar["healthcheck"]["test"] == ["CMD", "kafka-sidecar", "stats", "--endpoint",
                                              sidecar["environment"]["KAFKA_SIDECAR_ENDPOINT"]]


def test_compose_app_is_in_the_group_the_image_runs_the_daemon_as(compose) -> None:
    dockerfile = (COMPOSE / "Dockerfile").read_text()
    gid = re.search(r"groupadd --system --gid (\d+) kafka-sidecar", dockerfile)[1]
    assert "USER kafka-sidecar:kafka-sidecar" in dockerfile
    assert gid in compose["services"]["app"]["group_add"]


def test_compose_sidecar_settings_pass_check_config(compose, tmp_path) -> None:
    sidecar = compose["services"]["sidecar"]
    variables = {name: str(value) for name, value in sidecar["environment"].items()}
    (tmp_path / "empty.toml").touch()
    checked = check_config(tmp_path / "empty.toml", variables)
    assert sum(origin == "environment" for _, origin in checked.values()) == len(variables)
    # The sidecar sees its clients' real pids; it has time to send what is queued; its metrics are published.
    assert sidecar["pid"] == "host"
    grace = re.fullmatch(r"(\d+)s", sidecar["stop_grace_period"])
    assert int(grace[1]) * 1000 > int(checked["sidecar.close.timeout.ms"][0])
    assert checked["sidecar.metrics.host"][0] == "0.0.0.0"
    port = checked["sidecar.metrics.port"][0]
    assert sidecar["ports"] == [f"127.0.0.1:{port}:{port}"]


def test_compose_creates_the_topic_the_app_produces_to_on_the_broker_the_sidecar_uses(compose) -> None:
    services = compose["services"]
    command = services["topic"]["command"]
    topic, broker = command[command.index("create") + 1], command[command.index("--broker") + 1]
    assert f'producer.send("{topic}"' in services["app"]["command"][0]
    advertised = services["broker"]["command"][services["broker"]["command"].index("--advertised-listener-url") + 1]
    assert broker == advertised == "tcp://" + services["sidecar"]["environment"]["KAFKA_SIDECAR_BOOTSTRAP_SERVERS"]
    assert services["app"]["depends_on"] == {"sidecar": {"condition": "service_healthy"},
                                             "topic": {"condition": "service_completed_successfully"}}


def program(script: str, topic: str) -> str:
    """An example's program, producing to ``topic`` instead of its own."""
    assert script.count('"events"') == 1
    return script.replace('"events"', f'"{topic}"')


@pytest.mark.broker
def test_the_applications_programs_produce_through_a_daemon(compose, clients, broker, topic_factory, sidecar,
                                                            tmp_path) -> None:
    topic = topic_factory(3)
    daemon = sidecar(broker.bootstrap)
    env = {**os.environ, "KAFKA_SIDECAR_ENDPOINT": daemon.endpoint}
    # The compose app: ten records, each one's partition and offset printed, then it exits.
    app = subprocess.run([sys.executable, "-c", program(compose["services"]["app"]["command"][0], topic)], env=env,
                         capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert app.returncode == 0, app.stderr
    assert len(re.findall(rf"delivered to {topic}\[\d\] at offset \d+", app.stdout)) == 10, app.stdout
    # The Kubernetes app: a record a second, each delivery printed, until it is stopped.
    container = pod_spec(clients["producer-app.yaml"])["containers"][0]
    assert container["command"] == ["python", "-c"]
    output = tmp_path / "producer-app.out"
    with output.open("w") as out:
        app = subprocess.Popen([sys.executable, "-c", program(container["args"][0], topic)], env=env, stdout=out,
                               stderr=subprocess.STDOUT, cwd=tmp_path)
        try:
            assert wait_until(lambda: output.read_text().count(f"delivered to {topic}[") >= 2, timeout=60), \
                output.read_text()
        finally:
            app.send_signal(signal.SIGTERM)
            app.wait(30)
    lines = output.read_text().splitlines()
    assert all(re.fullmatch(rf"delivered to {topic}\[\d\] at offset \d+", line) for line in lines), lines
