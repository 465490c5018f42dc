"""systemd/: the unit passes `systemd-analyze verify` and scores as hardened; sysusers.d makes the user and group
it runs as, tmpfiles.d the directories it needs, with the owners and modes the unit expects.

Each tool runs with --root on a directory the test builds, never on this host's own users or files.
"""

from __future__ import annotations

import re
import shlex
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from client_stub.contract.ipc import DEFAULT_ENDPOINT

SYSTEMD = Path(__file__).resolve().parents[2] / "systemd"
UNIT = SYSTEMD / "kafka-sidecar.service"
SYSUSERS = SYSTEMD / "sysusers.d" / "kafka-sidecar.conf"
TMPFILES = SYSTEMD / "tmpfiles.d" / "kafka-sidecar.conf"


def systemd_version() -> int:
    """systemd-analyze's version (``systemd 252 (252.38-1~deb12u1)``), 0 without it."""
    if shutil.which("systemd-analyze") is None:
        return 0
    return int(subprocess.run(["systemd-analyze", "--version"], capture_output=True, text=True).stdout.split()[1])


# verify --recursive-errors and security --offline and --threshold came with systemd 250.
pytestmark = pytest.mark.skipif(systemd_version() < 250, reason="needs systemd-analyze 250 or later "
                                                                "(deploy/install-system-packages.sh installs it)")


def unit_settings(text: str) -> dict[str, dict[str, str]]:
    """Each section's settings as systemd reads them: the last assignment of a key wins."""
    sections: dict[str, dict[str, str]] = {}
    section: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = sections.setdefault(line.strip("[]"), {})
        else:
            key, _, value = line.partition("=")
            section[key.strip()] = value.strip()
    return sections


SERVICE = unit_settings(UNIT.read_text())["Service"]


def run(*command: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(part) for part in command], capture_output=True, text=True, timeout=60)


def unit_root(tmp_path: Path, unit_text: str | None = None) -> Path:
    """A root holding the unit (or ``unit_text`` in its place) and an executable at the path of each of its
    commands: ExecStart's the kafka-sidecar of this environment, the others this host's own."""
    root = tmp_path / "root"
    units = root / "etc" / "systemd" / "system"
    units.mkdir(parents=True)
    (units / UNIT.name).write_text(UNIT.read_text() if unit_text is None else unit_text)
    for key, command in SERVICE.items():
        if not key.startswith("Exec"):
            continue
        # systemd's prefixes (-, @, :, +, !) ask for special handling; the path follows them.
        path = Path(shlex.split(command)[0].lstrip("-@:+!"))
        source = Path(sys.executable).with_name("kafka-sidecar") if key == "ExecStart" else path
        assert source.is_file(), f"{key}={command}: {source} does not exist"
        # A copy, not a link: systemd-analyze resolves links inside the root.
        target = root / path.relative_to("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target)
    return root


def verify(root: Path) -> subprocess.CompletedProcess[str]:
    # The root holds no other unit (not even sysinit.target, which every service requires), and no
    # systemd runs as PID 1 here: --recursive-errors=no judges the unit itself, not what it pulls in.
    return run("systemd-analyze", f"--root={root}", "verify", "--recursive-errors=no", UNIT.name)


def test_the_unit_passes_systemd_analyze_verify(tmp_path) -> None:
    result = verify(unit_root(tmp_path))
    assert (result.returncode, result.stdout + result.stderr) == (0, "")


@pytest.mark.parametrize(("change", "message"), [
    (("\nProtectSystem=strict\n", "\nProtectSystem=strict\nProtectKernelTunabels=yes\n"),
     "Unknown key 'ProtectKernelTunabels'"),
    (("\nType=notify\n", "\nType=notfy\n"), "Failed to parse service type"),
    (("\nExecStart=/opt/kafka-sidecar/bin/kafka-sidecar ", "\nExecStart=/opt/kafka-sidecar/bin/kafka-sidecarr "),
     "is not executable"),
])
def test_verify_as_run_here_still_finds_the_units_own_mistakes(tmp_path, change, message) -> None:
    old, new = change
    assert UNIT.read_text().count(old) == 1
    result = verify(unit_root(tmp_path, UNIT.read_text().replace(old, new)))
    assert result.returncode != 0
    assert message in result.stderr


def test_the_unit_is_hardened(tmp_path) -> None:
    # systemd-analyze's exposure score, 0 (locked down) to 10; its threshold is in tenths. What keeps the
    # unit above 0 the daemon needs: the network, others' uids (SO_PEERCRED), group-writable sockets.
    result = run("systemd-analyze", "security", "--offline=yes", f"--root={unit_root(tmp_path)}", "--threshold=20",
                 "--no-pager", UNIT.name)
    exposure = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", result.stdout)
    assert exposure is not None, result.stdout + result.stderr
    assert result.returncode == 0, f"exposure {exposure[1]}, above 2.0:\n{result.stdout}"


def users_root(tmp_path: Path) -> Path:
    """A root whose users and groups are those sysusers.d makes, and nothing else."""
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    result = run("systemd-sysusers", f"--root={root}", SYSUSERS)
    assert result.returncode == 0, result.stderr
    return root


def entries(path: Path) -> dict[str, list[str]]:
    """/etc/passwd or /etc/group: name -> the other fields."""
    return {fields[0]: fields[1:] for fields in (line.split(":") for line in path.read_text().splitlines())}


def test_sysusers_makes_the_units_user_and_group(tmp_path) -> None:
    root = users_root(tmp_path)
    passwd, group = entries(root / "etc" / "passwd"), entries(root / "etc" / "group")
    _, uid, gid, _, home, shell = passwd[SERVICE["User"]]
    assert int(group[SERVICE["Group"]][1]) == int(gid)
    assert int(uid) < 1000  # a system user
    assert shell.endswith("/nologin")
    assert home == "/"


def test_tmpfiles_makes_what_the_unit_expects_with_its_owners_and_modes(tmp_path) -> None:
    root = users_root(tmp_path)
    passwd, group = entries(root / "etc" / "passwd"), entries(root / "etc" / "group")
    uid, gid = int(passwd[SERVICE["User"]][1]), int(group[SERVICE["Group"]][1])
    result = run("systemd-tmpfiles", "--create", f"--root={root}", TMPFILES)
    assert result.returncode == 0, result.stderr

    # The sockets' directory, at boot as the unit makes it at start, and where the default endpoint is.
    sockets = Path("/run") / SERVICE["RuntimeDirectory"]
    assert owner_and_mode(root, sockets) == (uid, gid, SERVICE["RuntimeDirectoryMode"])
    assert SERVICE["RuntimeDirectoryPreserve"] == "yes"
    assert Path(DEFAULT_ENDPOINT.removeprefix("ipc://")).parent == sockets

    # The settings' directory: where ExecStart reads them; the daemon's user's alone (not its group's: the
    # producers'), root's group.
    command = shlex.split(SERVICE["ExecStart"])
    config = Path(command[command.index("--config") + 1])
    assert owner_and_mode(root, config.parent) == (uid, 0, "0700")


def owner_and_mode(root: Path, path: Path) -> tuple[int, int, str]:
    """The uid, gid and mode (as systemd writes it: 0750) of ``path`` inside ``root``."""
    made = (root / path.relative_to("/")).stat()
    return made.st_uid, made.st_gid, f"{stat.S_IMODE(made.st_mode):04o}"
