"""Processes of other users, for the tests of a host that several users share (the tests run as root).

The checkout and this environment's packages may sit where other users cannot read them (a clone under
a private temporary directory, a virtual environment in it): ``SharedPackages`` copies what the other
users' processes import (the project's packages with their built C extensions, and the distributions
the project depends on) into a directory they can read. ``ensure_user`` makes (once per machine,
idempotently) a group and system users in it; ``start_python`` and ``run_python`` start an interpreter
that other users can execute, as one of them, on that copy.

``why_not`` says why none of this can be done here; ``skip_or_fail`` skips a test for that reason,
or fails it when the environment says CI: a CI run that cannot run these tests must say so.
"""

from __future__ import annotations

import grp
import importlib.metadata
import os
import pwd
import shutil
import stat
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
# The project's packages, as they are imported (with the C extensions built in place).
PROJECT_PACKAGES = ("client_stub", "service")
DISTRIBUTION = "kafka-sidecar"
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
    """A Python of this one's version that other users can run, or None.

    This interpreter's own file (a virtual environment's python is a link to it) when it and its standard
    library are open to them, else the system's python of the same minor version, whose extension modules
    are compatible. Its packages come from ``SharedPackages``, not from any environment.
    """
    current = Path(sys.executable).resolve()
    stdlib = Path(os.__file__).parent
    if _open_to_others(current) and _open_to_others(stdlib):
        return str(current)
    system = Path(f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}")
    return str(system) if system.exists() and _open_to_others(system) else None


def open_temp_dir() -> Path | None:
    """A directory for temporary files that other users can reach, or None."""
    for candidate in (tempfile.gettempdir(), "/tmp", "/var/tmp"):
        path = Path(candidate)
        if path.is_dir() and _open_to_others(path):
            return path
    return None


def why_not() -> str | None:
    """Why processes of other users cannot be started here, or None if they can."""
    if os.geteuid() != 0:
        return "the tests do not run as root: they cannot start processes of other users"
    if shutil.which("useradd") is None or shutil.which("groupadd") is None:
        return "no useradd and groupadd to make the users"
    if shared_interpreter() is None:
        return f"no Python {sys.version_info.major}.{sys.version_info.minor} that other users can run"
    if open_temp_dir() is None:
        return "no temporary directory that other users can reach, to copy the packages into"
    return None


def required() -> bool:
    """Whether the environment says it is a CI run (CI=true), where tests that cannot run must fail."""
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def skip_or_fail() -> None:
    """Skip the calling test if processes of other users cannot be started here; in a CI run, fail it."""
    reason = why_not()
    if reason is None:
        return
    if required():
        pytest.fail(f"CI is set, and the tests of other users' processes cannot run: {reason}", pytrace=False)
    pytest.skip(reason)


def _dependencies(name: str) -> set[str]:
    """The distributions ``name`` needs at run time (its extras aside), and theirs, by canonical name."""
    found: set[str] = set()
    todo = [name]
    while todo:
        for line in importlib.metadata.distribution(todo.pop()).requires or []:
            requirement = Requirement(line)
            if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
                continue
            canonical = requirement.name.lower().replace("_", "-")
            if canonical not in found:
                found.add(canonical)
                todo.append(canonical)
    return found


class SharedPackages:
    """What other users' Pythons import, copied into a directory of ``open_temp_dir()`` that they can read:
    the project's packages as this checkout has them (its built C extensions included), the project's
    metadata, and every distribution it depends on. Removed on exit."""

    def __init__(self) -> None:
        self.path: Path | None = None

    def __enter__(self) -> Self:
        base = open_temp_dir()
        assert base is not None, why_not()
        self.path = Path(tempfile.mkdtemp(prefix="kafka-sidecar-packages-", dir=base))
        try:
            self._copy(self.path)
        except BaseException:
            shutil.rmtree(self.path)
            raise
        # Read (and searched, run where the original may be) by everyone; written by root alone.
        for directory, _, files in os.walk(self.path):
            os.chmod(directory, 0o755)
            for name in files:
                path = os.path.join(directory, name)
                os.chmod(path, os.stat(path).st_mode & 0o755 | 0o444)
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        if self.path is not None:
            shutil.rmtree(self.path, ignore_errors=True)
            self.path = None

    @staticmethod
    def _copy(into: Path) -> None:
        for package in PROJECT_PACKAGES:
            shutil.copytree(ROOT / package, into / package, ignore=shutil.ignore_patterns("__pycache__"))
        project = importlib.metadata.distribution(DISTRIBUTION)
        for distribution in [project, *map(importlib.metadata.distribution, _dependencies(DISTRIBUTION))]:
            for file in distribution.files or []:
                # The project's own files are its metadata alone: its packages are this checkout's, copied above
                # (an editable install's finder would lead back into the checkout). Files outside the
                # distribution's directory (scripts, ../../../bin) are not imported.
                if distribution is project and not file.parts[0].endswith(".dist-info"):
                    continue
                source = Path(distribution.locate_file(file))
                if ".." in file.parts or file.suffix == ".pyc" or not source.is_file():
                    continue
                target = into.joinpath(*file.parts)
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, target)

    def environment(self) -> dict[str, str]:
        """The environment for a Python of another user: the copy first on its path, this run's KAFKA_SIDECAR_*."""
        assert self.path is not None, "not entered"
        return {"PATH": "/usr/local/bin:/usr/bin:/bin", "PYTHONPATH": str(self.path), "HOME": "/nonexistent",
                "LANG": "C.UTF-8", **{k: v for k, v in os.environ.items() if k.startswith("KAFKA_SIDECAR_")}}


@dataclass(frozen=True)
class User:
    """A user of the host, and the copy of the packages its Python imports."""

    name: str
    uid: int
    gid: int
    packages: SharedPackages

    def popen_options(self, umask: int) -> dict[str, Any]:
        """subprocess.Popen's options for a process of this user (in its group only), in the packages' directory."""
        assert self.packages.path is not None, "the shared packages are gone"
        return {"user": self.uid, "group": self.gid, "extra_groups": [], "umask": umask,
                "env": self.packages.environment(), "cwd": self.packages.path}


def ensure_group(name: str) -> int:
    try:
        return grp.getgrnam(name).gr_gid
    except KeyError:
        subprocess.run(["groupadd", "--system", name], check=True, capture_output=True)
        return grp.getgrnam(name).gr_gid


def ensure_user(name: str, group: str, packages: SharedPackages) -> User:
    """A system user whose primary group is ``group`` (made if missing), whose Python imports ``packages``."""
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
    return User(name, entry.pw_uid, entry.pw_gid, packages)


def run_python(user: User, code: str, *, umask: int = 0o007,
               timeout: float | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``code`` as ``user`` and wait for it to end (``timeout``: seconds after which it is killed, a hang's
    bound; None: the test's own timeout bounds it)."""
    process = start_python(user, code, umask=umask)
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except BaseException:
        process.kill()
        process.communicate()
        raise
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def start_python(user: User, code: str, *, umask: int = 0o007) -> subprocess.Popen[str]:
    """Start ``code`` as ``user``, its stdin, stdout and stderr pipes of text."""
    interpreter = shared_interpreter()
    assert interpreter is not None, why_not()
    return subprocess.Popen([interpreter, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **user.popen_options(umask))
