"""The package is typed: mypy --strict passes on what pyproject.toml's [tool.mypy] names and on the Python examples
of the documentation, and the stubs of the C extensions say what the extensions and their pure-Python twins are.

mypy keeps its cache in the project's .mypy_cache: a run after the first checks only what changed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import mypy.api
import pytest

from tests.support.docs import examples
from tests.support.fastpath import c_extension

ROOT = Path(__file__).resolve().parents[2]

# Each C extension's stub, and the pure-Python twin that must have the same names and signatures.
EXTENSIONS = {"client_stub._fastpath": "client_stub._fastpath_py", "service._fastpath": "service._fastpath_py"}

# What stubtest may find the twins do otherwise than the stubs say, and why.
ALLOWED = """
# The twins list their public names; the C modules have none to list.
(client_stub|service)\\._fastpath_py\\.__all__
# The twin's send() takes its arguments as *more and a topic that may be missing, to raise the C code's own errors.
client_stub\\._fastpath_py\\.Appender\\.send
"""


def test_mypy_strict_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)  # the files [tool.mypy] names, and the cache, are the project's
    stdout, stderr, status = mypy.api.run(["--strict", "--config-file", "pyproject.toml"])
    assert status == 0, stdout + stderr


def test_the_documentations_examples_pass_mypy_strict(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # Each example a module of its own, named after its page and line, as a reader would paste it into a file.
    files = []
    for example in examples():
        if example.language in ("python", "spark"):
            path = tmp_path / f"{example.page.replace('/', '_').removesuffix('.md')}_{example.line}.py"
            path.write_text(example.code)
            files.append(str(path))
    assert files, "the documentation has no Python example"
    monkeypatch.chdir(ROOT)  # the project's settings and cache; the files given replace what [tool.mypy] names
    stdout, stderr, status = mypy.api.run(["--strict", "--config-file", "pyproject.toml", *files])
    assert status == 0, stdout + stderr


def test_the_stubs_say_what_the_extensions_and_their_twins_are(tmp_path: Path) -> None:
    # stubtest compares a module with the stub mypy finds for it: each twin's is its extension's stub, copied
    # into a folder before the project on mypy's path.
    modules = list(EXTENSIONS.values())
    for extension, twin in EXTENSIONS.items():
        package, name = extension.split(".")
        stub = ROOT / package / f"{name}.pyi"
        (tmp_path / package).mkdir(exist_ok=True)
        (tmp_path / package / "__init__.pyi").touch()
        shutil.copy(stub, tmp_path / package / f"{name}.pyi")
        shutil.copy(stub, tmp_path / f"{twin.replace('.', '/')}.pyi")
        if c_extension(extension) is not None:  # not where it could not be built
            modules.append(extension)
    allowlist = tmp_path / "allowlist.txt"
    allowlist.write_text(ALLOWED)
    # The modules are this checkout's; mypy sees none of its files, only the stubs.
    env = {**os.environ, "MYPYPATH": str(tmp_path), "PYTHONPATH": str(ROOT)}
    run = subprocess.run([sys.executable, "-m", "mypy.stubtest", "--allowlist", str(allowlist), *modules],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
