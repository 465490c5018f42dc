"""Processes of other users, for the tests of a host that several users share (the tests run as root).

``HostUsers`` makes (once per machine, idempotently) a group and system users in it, and says how to
start Python as one of them: an interpreter that other users can execute (this one when every
directory above it is open to them, else the system's python of the same minor version, whose
extension modules are compatible), with this checkout and this environment's packages on its path.
"""

from __future__ import annotations

import grp
import os
import pwd
import shutil
import site
import stat
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Names of this test suite's own group and users: system accounts without a home or a login shell.
GROUP = "kafka-sidecar-test"
OUTSIDER_GROUP = "kafka-sidecar-test-other"


def _open_to_others(path: Path) -> bool:
    """Whether users other than the owner can reach and read ``path`` (every directory above it searchable)."""
    path = path.resolve()
    for part in [path, *path.parents]:
        mode = part.stat().st_mode
        needed = stat.S_IXOTH if stat.S_ISDIR(mode) else stat.S_IROTH
        if not mode & needed:
            return False
    return True


def shared_interpreter() -> str | None:
    """A Python that other users can run with this environment's packages, or None."""
    current = Path(sys.executable)
    stdlib = Path(os.__file__).parent
    if _open_to_others(current) and _open_to_others(stdlib):
        return str(current)
    system = Path(f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}")
    return str(system) if system.exists() and _open_to_others(system) else None


def why_not() -> str | None:
    """Why processes of other users cannot be started here, or None if they can."""
    if os.geteuid() != 0:
        return "the tests do not run as root: they cannot start processes of other users"
    if shutil.which("useradd") is None or shutil.which("groupadd") is None:
        return "no useradd and groupadd to make the users"
    if shared_interpreter() is None:
        return f"no Python {sys.version_info.major}.{sys.version_info.minor} that other users can run"
    if not _open_to_others(ROOT) or not all(_open_to_others(Path(p)) for p in site.getsitepackages()):
        return f"{ROOT} or this environment's packages are not readable by other users"
    return None


@dataclass(frozen=True)
class User:
    name: str
    uid: int
    gid: int


def ensure_group(name: str) -> int:
    try:
        return grp.getgrnam(name).gr_gid
    except KeyError:
        subprocess.run(["groupadd", "--system", name], check=True, capture_output=True)
        return grp.getgrnam(name).gr_gid


def ensure_user(name: str, group: str) -> User:
    """A system user whose primary group is ``group`` (made if missing)."""
    gid = ensure_group(group)
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", "--gid", group,
                        name], check=True, capture_output=True)
        entry = pwd.getpwnam(name)
    if entry.pw_gid != gid:
        subprocess.run(["usermod", "--gid", group, name], check=True, capture_output=True)
        entry = pwd.getpwnam(name)
    return User(name, entry.pw_uid, entry.pw_gid)


def python_env() -> dict[str, str]:
    """The environment for a Python of another user: this checkout and this environment's packages."""
    path = os.pathsep.join([str(ROOT), *site.getsitepackages()])
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "PYTHONPATH": path, "HOME": "/nonexistent", "LANG": "C.UTF-8",
            **{k: v for k, v in os.environ.items() if k.startswith("KAFKA_SIDECAR_")}}


def run_python(user: User, code: str, *, umask: int = 0o007, timeout: float = 120.0,
               cwd: str = "/") -> subprocess.CompletedProcess[str]:
    """Run ``code`` as ``user`` (in its group only) and wait for it."""
    process = start_python(user, code, umask=umask, cwd=cwd)
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except BaseException:
        process.kill()
        process.communicate()
        raise
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def start_python(user: User, code: str, *, umask: int = 0o007, cwd: str = "/") -> subprocess.Popen[str]:
    """Start ``code`` as ``user`` (in its group only), its stdin, stdout and stderr pipes of text."""
    interpreter = shared_interpreter()
    assert interpreter is not None, why_not()
    return subprocess.Popen([interpreter, "-c", code], user=user.uid, group=user.gid, extra_groups=[], umask=umask,
                            env=python_env(), cwd=cwd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
