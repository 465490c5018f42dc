"""client_stub.fastpath and service.fastpath: the C extensions, or their pure-Python twins, chosen at import.

Each choice is made in a fresh interpreter: once made, it holds for the life of the process.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig

import pytest

from tests.support.fastpath import c_extension

BUILT = c_extension("client_stub._fastpath") is not None and c_extension("service._fastpath") is not None
needs_extensions = pytest.mark.skipif(not BUILT, reason="the C extensions are not built")

# What a fresh interpreter chose: the client's, the daemon's, and where the producer's Appender comes from.
REPORT = """
import client_stub.fastpath, client_stub.producer, service.fastpath
print(client_stub.fastpath.IMPLEMENTATION, service.fastpath.IMPLEMENTATION, client_stub.producer.Appender.__module__)
"""
# The extensions as they are where they could not be built: not importable.
BLOCKED = "import sys; sys.modules['client_stub._fastpath'] = sys.modules['service._fastpath'] = None\n"


def choice(variable: str | None, *, prelude: str = "") -> list[str]:
    """What an interpreter started with KAFKA_SIDECAR_PURE_PYTHON=``variable`` (None: unset) chose."""
    env = {k: v for k, v in os.environ.items() if k != "KAFKA_SIDECAR_PURE_PYTHON"}
    if variable is not None:
        env["KAFKA_SIDECAR_PURE_PYTHON"] = variable
    run = subprocess.run([sys.executable, "-c", prelude + REPORT], env=env, capture_output=True, text=True,
                         timeout=60)
    assert run.returncode == 0, run.stderr
    return run.stdout.split()


PYTHON = ["python", "python", "client_stub._fastpath_py"]
C = ["c", "c", "client_stub._fastpath"]


@pytest.mark.parametrize("variable", ["1", "true", "yes", "True", "YES"])
def test_a_true_variable_chooses_the_python_twins(variable: str) -> None:
    assert choice(variable) == PYTHON


@needs_extensions
@pytest.mark.parametrize("variable", [None, "", "0", "false", "no"])
def test_the_c_extensions_are_chosen_unless_the_variable_is_true(variable: str | None) -> None:
    assert choice(variable) == C


def test_extensions_that_cannot_be_imported_leave_the_python_twins() -> None:
    assert choice(None, prelude=BLOCKED) == PYTHON


def test_where_there_is_a_compiler_the_extensions_are_built() -> None:
    # The extensions are optional at build time, so that a machine without a C compiler installs the
    # pure-Python twins: a build that failed where it could have worked would otherwise go unnoticed,
    # and every C variant of the tests would be skipped.
    compiler = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(compiler) is None:
        pytest.skip(f"no C compiler ({compiler}): the twins are what this machine can have")
    assert BUILT, f"{compiler} is here, yet the C extensions were not built: see the output of pip install"
