"""The project's C extensions built with AddressSanitizer and UndefinedBehaviorSanitizer, and pytest run on them.

``SanitizedTree.build`` copies the sources (packages and tests) into a scratch directory and compiles
every extension that pyproject.toml lists there, in place, with the sanitizers; ``run_pytest`` runs
pytest in that tree with gcc's ASan runtime preloaded. The repository's own built extensions and the
editable install are left alone: the subprocess imports from the scratch tree, which holds no other
build of the extensions, and this module, loaded there as a pytest plugin (``-p``), refuses to start
unless each extension module was loaded from the file built for it.

A sanitizer report aborts the process that made it, and is written to a file of the scratch
directory's ``reports`` whichever process made it: pytest, a daemon it starts, a forked child.
"""

from __future__ import annotations

import functools
import importlib
import json
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import settings

SANITIZE = ("-fsanitize=address,undefined", "-fno-sanitize-recover=undefined", "-fno-omit-frame-pointer", "-g", "-O1")
# gcc both builds and supplies the runtime (-print-file-name): an ASan runtime of another compiler would not
# match the instrumentation. Python's own CFLAGS are left out on purpose: their -fwrapv defines signed
# overflow, which UBSan is here to catch.
COMPILER = "gcc"
# What the subprocess imports: everything, so that nothing comes from the repository or the editable install.
COPIED = ("pyproject.toml", "client_stub", "service", "tests")
# The extension modules the subprocess must load from the scratch tree, {name: path} in JSON (read by the plugin).
EXPECTED_VARIABLE = "KAFKA_SIDECAR_SANITIZED_EXTENSIONS"
HEADER = "sanitized build:"
# The keys of [[tool.setuptools.ext-modules]] that build() knows how to honour; any other fails the build
# rather than being silently ignored.
_KNOWN_KEYS = {"name", "sources", "include-dirs", "define-macros", "libraries", "extra-compile-args",
               "extra-link-args", "optional"}


class SanitizersUnavailable(Exception):
    """The compiler cannot build a Python extension with the sanitizers here (the reason is the message)."""


class CompileError(Exception):
    """The compiler failed: its command and what it said are the message."""


@dataclass(frozen=True)
class Extension:
    """One [[tool.setuptools.ext-modules]] entry of pyproject.toml."""

    name: str
    sources: tuple[str, ...]
    include_dirs: tuple[str, ...] = ()
    define_macros: tuple[tuple[str, str | None], ...] = ()
    libraries: tuple[str, ...] = ()
    compile_args: tuple[str, ...] = ()
    link_args: tuple[str, ...] = ()


def extensions(pyproject: Path) -> list[Extension]:
    """The C extensions that ``pyproject`` declares."""
    with pyproject.open("rb") as file:
        entries = tomllib.load(file).get("tool", {}).get("setuptools", {}).get("ext-modules", [])
    found = []
    for entry in entries:
        unknown = set(entry) - _KNOWN_KEYS
        if unknown:
            raise ValueError(f"{entry['name']}: tests/support/sanitizers.py does not build with {sorted(unknown)}")
        found.append(Extension(
            name=entry["name"], sources=tuple(entry["sources"]), include_dirs=tuple(entry.get("include-dirs", ())),
            define_macros=tuple((name, value) for name, value in entry.get("define-macros", ())),
            libraries=tuple(entry.get("libraries", ())), compile_args=tuple(entry.get("extra-compile-args", ())),
            link_args=tuple(entry.get("extra-link-args", ()))))
    return found


def _compile(sources: Sequence[Path], target: Path, compile_args: Sequence[str] = (),
             link_args: Sequence[str] = ()) -> None:
    """A sanitized Python extension module ``target`` from ``sources``."""
    # The sanitizer flags come after the project's own, so that -O1 wins over its -O2.
    command = [COMPILER, *compile_args, *SANITIZE, "-fPIC", "-shared", f"-I{sysconfig.get_paths()['include']}",
               *map(str, sources), "-o", str(target), *link_args]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise CompileError(f"{' '.join(command)}\n{result.stdout}{result.stderr}".strip())


def _runtime(library: str) -> str:
    """The path of one of gcc's sanitizer runtimes; SanitizersUnavailable if it has none."""
    result = subprocess.run([COMPILER, f"-print-file-name={library}"], capture_output=True, text=True, check=False)
    path = result.stdout.strip()
    # gcc prints the bare name back when it has no such file.
    if result.returncode != 0 or not os.path.isabs(path) or not os.path.exists(path):
        raise SanitizersUnavailable(f"{COMPILER} has no {library} (Debian/Ubuntu: apt-get install libasan8 libubsan1)")
    return path


@functools.cache
def runtimes() -> tuple[str, str]:
    """The paths of gcc's ASan and UBSan runtimes; SanitizersUnavailable if it lacks one."""
    if shutil.which(COMPILER) is None:
        raise SanitizersUnavailable(f"no {COMPILER} on PATH")
    return _runtime("libasan.so"), _runtime("libubsan.so")


def check_compiler(scratch: Path) -> None:
    """Raise SanitizersUnavailable unless the compiler builds a sanitized extension module in ``scratch``."""
    runtimes()
    probe = scratch / "probe.c"
    probe.write_text("#include <Python.h>\nint probe(int n) { return n + 1; }\n")
    try:
        _compile([probe], scratch / "probe.so")
    except CompileError as error:
        raise SanitizersUnavailable(f"{COMPILER} cannot build an extension with the sanitizers: {error}") from None


# The sitecustomize of every Python process of a run. gcc's ASan and UBSan runtimes are two libraries with a
# report file each, and UBSan's ignores log_path: the function it sets it with is also ASan's, which wins (preloaded
# first). Called in UBSan's own library, it sets UBSan's, so that a report of any process, the daemon's too, is a
# file in the reports directory rather than a line in a log that its test removes. (It hides any other
# sitecustomize, which the tests do without.)
_SITECUSTOMIZE = """\
import ctypes

ctypes.CDLL({ubsan!r}).__sanitizer_set_report_path({log!r}.encode())
"""


@dataclass(frozen=True)
class SanitizedTree:
    """A copy of the project whose C extensions are sanitized builds, made by ``build``."""

    root: Path
    built: dict[str, Path]  # extension module name -> its sanitized .so
    reports: Path  # where the sanitizers write what they find, a file per process
    site: Path  # the directory of the run's sitecustomize

    @classmethod
    def build(cls, project: Path, scratch: Path) -> SanitizedTree:
        """Copy ``project``'s sources into ``scratch``/tree and build each extension there with the sanitizers.

        Raises SanitizersUnavailable when the compiler cannot build with them at all, and CompileError when it
        cannot build one of the extensions.
        """
        check_compiler(scratch)
        root = scratch / "tree"
        for name in COPIED:
            source = project / name
            if source.is_dir():
                # No built extension is copied: the only ones in the tree are those built below.
                shutil.copytree(source, root / name, ignore=shutil.ignore_patterns("*.so", "__pycache__"))
            else:
                root.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, root / name)
        built = {}
        for extension in extensions(root / "pyproject.toml"):
            target = root.joinpath(*extension.name.split(".")).with_name(
                extension.name.rpartition(".")[2] + sysconfig.get_config_var("EXT_SUFFIX"))
            compile_args = [*extension.compile_args, *(f"-I{root / d}" for d in extension.include_dirs),
                            *(f"-D{n}" if v is None else f"-D{n}={v}" for n, v in extension.define_macros)]
            link_args = [*extension.link_args, *(f"-l{library}" for library in extension.libraries)]
            _compile([root / s for s in extension.sources], target, compile_args, link_args)
            built[extension.name] = target
        reports = scratch / "reports"
        reports.mkdir()
        site = scratch / "site"
        site.mkdir()
        (site / "sitecustomize.py").write_text(_SITECUSTOMIZE.format(ubsan=runtimes()[1], log=str(reports / "ubsan")))
        return cls(root, built, reports, site)

    def environment(self) -> dict[str, str]:
        """The environment of a process that runs the tree's tests on its sanitized extensions."""
        env = dict(os.environ)
        # Both twins of the fast path exist; the tests must get the C one.
        env.pop("KAFKA_SIDECAR_PURE_PYTHON", None)
        # ASan's runtime must be the first library of the process: the extensions come too late, with import.
        preload = env.get("LD_PRELOAD")
        env["LD_PRELOAD"] = runtimes()[0] + (f":{preload}" if preload else "")
        # Leaks are not checked: CPython frees little at exit, and that is not ours to fix. A report aborts (UBSan's
        # too), so that a forked child's death by one is no ordinary exit(1).
        env["ASAN_OPTIONS"] = f"detect_leaks=0:abort_on_error=1:halt_on_error=1:log_path={self.reports / 'asan'}"
        env["UBSAN_OPTIONS"] = "print_stacktrace=1:halt_on_error=1:abort_on_error=1"
        # Python's objects (bytes, bytearray: what the extensions write into) from malloc, not from pymalloc's
        # arenas, so that ASan sees each one's bounds.
        env["PYTHONMALLOC"] = "malloc"
        # The tree first, though pytest (rootdir) and the daemon (cwd) would find it anyway: the repository's
        # packages and their builds come only from the editable install's finder, which is asked last.
        env["PYTHONPATH"] = os.pathsep.join([str(self.root), str(self.site)])
        env[EXPECTED_VARIABLE] = json.dumps({name: str(path) for name, path in self.built.items()})
        return env

    def found(self) -> str:
        """What the sanitizers reported, every process's report in full ("" if nothing)."""
        return "\n".join(path.read_text(errors="replace") for path in sorted(self.reports.iterdir()))

    def run_pytest(self, args: Sequence[str], *, timeout: float) -> subprocess.CompletedProcess[str]:
        """``python -m pytest args`` in the tree, on the sanitized extensions; its output is captured.

        Killed, with all it started, after ``timeout`` seconds (its output then ends with a line that says so).
        """
        command = [sys.executable, "-m", "pytest", "-p", "tests.support.sanitizers", "-p", "no:cacheprovider", *args]
        # A session of its own: a pytest that a report aborts leaves its broker and daemons behind, to be ended here.
        process = subprocess.Popen(command, cwd=self.root, env=self.environment(), stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            stdout, stderr = process.communicate()
            stderr += f"\n(killed after {timeout:.0f}s)"
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass  # nothing left
        return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


# -- the plugin, in the subprocess ------------------------------------------------------------------


def pytest_configure(config: pytest.Config) -> None:
    """Refuse to run unless every extension module comes from its sanitized build; no Hypothesis deadlines."""
    expected = os.environ.get(EXPECTED_VARIABLE)
    if expected is None:
        return
    for name, path in json.loads(expected).items():
        loaded = importlib.import_module(name).__file__
        if loaded is None or not os.path.samefile(loaded, path):
            raise pytest.UsageError(f"{name} was loaded from {loaded}, not from its sanitized build {path}")
    # Instrumented code runs several times slower: a deadline would fail tests on speed, which is not
    # what this run checks.
    settings.register_profile("sanitizers", deadline=None)
    settings.load_profile("sanitizers")


def pytest_report_header(config: pytest.Config) -> list[str]:
    """Which file each extension module was loaded from."""
    expected = os.environ.get(EXPECTED_VARIABLE)
    if expected is None:
        return []
    return [f"{HEADER} {name} from {sys.modules[name].__file__}" for name in json.loads(expected)]
