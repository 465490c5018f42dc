"""Where the daemon's settings come from: a TOML file, the environment and the command line.

Each names a setting as Kafka does (``linger.ms``); precedence, lowest first: the
defaults, the file, the environment, the command line (``-X``, ``--bootstrap-servers``,
``--endpoint``). The file::

    [producer]                      # Kafka's producer settings, as -X takes them
    bootstrap.servers = "kafka-1:9092,kafka-2:9092"
    linger.ms = 10

    [sidecar]                       # the sidecar's own, without their "sidecar." prefix
    endpoint = "ipc:///run/kafka-sidecar/sidecar.sock"
    client.timeout.ms = 30000

    [metrics]                       # sidecar.metrics.*: the Prometheus page
    port = 9464

    [log]
    level = "INFO"
    format = "text"                 # or "json": one object a line
    file = "/var/log/kafka-sidecar/kafka-sidecar.log"   # else standard error; reopened on SIGHUP

TOML reads ``linger.ms = 10`` as a table ``linger`` holding ``ms``; such tables are
read back as the dotted name. In the environment, ``KAFKA_SIDECAR_`` and the name in
capitals with ``_`` for ``.`` (``KAFKA_SIDECAR_LINGER_MS=10``; the sidecar's own
without their prefix: ``KAFKA_SIDECAR_CLIENT_TIMEOUT_MS``). A key nobody knows is
refused with the nearest known name, as a value that does not parse or break a rule
is (by :class:`~service.config.ProducerConfig`).
"""

from __future__ import annotations

import difflib
import logging
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from client_stub.errors import ConfigError

from .config import KEYS

log = logging.getLogger(__name__)

SIDECAR_PREFIX = "sidecar."
# The sections of the file that hold settings, and the prefix their keys are written without: a setting belongs
# to the section of the longest prefix it has.
SECTIONS = {"producer": "", "sidecar": SIDECAR_PREFIX, "metrics": SIDECAR_PREFIX + "metrics."}
ENV_PREFIX = "KAFKA_SIDECAR_"
# Variables of the prefix that are no settings of the daemon's (read by the client library).
_OTHER_VARIABLES = {"KAFKA_SIDECAR_PURE_PYTHON"}
# The [log] keys, with their values (None: a path).
LOG_KEYS: dict[str, tuple[str, ...] | None] = {"level": ("DEBUG", "INFO", "WARNING", "ERROR"),
                                               "format": ("text", "json"), "file": None}
LOG_DEFAULTS = {"level": "INFO", "format": "text", "file": ""}

# Where a setting's value came from, lowest precedence first.
DEFAULT, FILE, ENVIRONMENT, COMMAND_LINE = "default", "file", "environment", "command line"


@dataclass(slots=True)
class Sources:
    """The settings given (by Kafka name) and the log's, each with where it came from."""

    settings: dict[str, Any] = field(default_factory=dict)
    origins: dict[str, str] = field(default_factory=dict)
    log: dict[str, str] = field(default_factory=lambda: dict(LOG_DEFAULTS))

    def give(self, name: str, value: Any, origin: str) -> None:
        self.settings[name] = value
        self.origins[name] = origin

    def origin(self, name: str) -> str:
        return self.origins.get(name, DEFAULT)


def environment_name(name: str) -> str:
    """The variable that sets ``name``: KAFKA_SIDECAR_LINGER_MS for linger.ms."""
    return ENV_PREFIX + name.removeprefix(SIDECAR_PREFIX).upper().replace(".", "_")


_BY_VARIABLE = {environment_name(name): name for name in KEYS}


def gather(config_file: str | Path | None, environment: Mapping[str, str], command_line: Mapping[str, Any]) -> Sources:
    """The settings of the file, then the environment, then the command line, each over the one before."""
    sources = Sources()
    if config_file is not None:
        _read_file(Path(config_file), sources)
    for variable, value in sorted(environment.items()):
        if not variable.startswith(ENV_PREFIX) or variable in _OTHER_VARIABLES:
            continue
        name = _BY_VARIABLE.get(variable)
        if name is None:
            close = difflib.get_close_matches(variable, _BY_VARIABLE, n=1)
            log.warning("%s is no setting of the daemon's: ignored%s", variable,
                        f" (did you mean {close[0]}?)" if close else "")
            continue
        sources.give(name, value, ENVIRONMENT)
    for name, value in command_line.items():
        sources.give(name, value, COMMAND_LINE)
    return sources


def _read_file(path: Path, sources: Sources) -> None:
    try:
        with path.open("rb") as file:
            document = tomllib.load(file)
    except OSError as exc:
        raise ConfigError(f"cannot read the configuration file {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path} is not TOML: {exc}") from None
    for section, table in document.items():
        if (section not in SECTIONS and section != "log") or not isinstance(table, dict):
            raise ConfigError(f"{path}: unknown section [{section}] (the sections are "
                              f"{', '.join(f'[{s}]' for s in [*SECTIONS, 'log'])})")
        for key, value in _flatten(table).items():
            if section == "log":
                sources.log[_log_key(path, key, value)] = value
                continue
            name = SECTIONS[section] + key
            if name not in KEYS or section_of(name) != section:
                raise ConfigError(f"{path}: unknown key {key!r} in [{section}]{_nearest(key, section)}")
            sources.give(name, value, FILE)


def section_of(name: str) -> str:
    """The section of the file a setting belongs to."""
    return max((s for s, prefix in SECTIONS.items() if name.startswith(prefix)), key=lambda s: len(SECTIONS[s]))


def _flatten(table: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A table's keys as dotted names: TOML reads ``linger.ms = 10`` as ``{"linger": {"ms": 10}}``."""
    flat: dict[str, Any] = {}
    for key, value in table.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[prefix + key] = value
    return flat


def _nearest(key: str, section: str) -> str:
    """What the message of an unknown key suggests: the right section, or a name of the section like it."""
    for prefix in {"", SIDECAR_PREFIX, *SECTIONS.values()}:
        # As written in another section, or with a prefix its section leaves out.
        name = prefix + key
        if name in KEYS and section_of(name) != section:
            home = section_of(name)
            return f" (it belongs in [{home}]{', without its prefix' if SECTIONS[home] and prefix else ''})"
    names = [name.removeprefix(SECTIONS[section]) for name in KEYS if section_of(name) == section]
    close = difflib.get_close_matches(key, names, n=1)
    return f" (did you mean {close[0]}?)" if close else ""


def _log_key(path: Path, key: str, value: Any) -> str:
    if key not in LOG_KEYS:
        close = difflib.get_close_matches(key, LOG_KEYS, n=1)
        raise ConfigError(f"{path}: unknown key {key!r} in [log]" + (f" (did you mean {close[0]}?)" if close else ""))
    choices = LOG_KEYS[key]
    if choices is None:
        if not isinstance(value, str):
            raise ConfigError(f"{path}: invalid value {value!r} for {key} in [log]: expected a path")
    elif value not in choices:
        raise ConfigError(f"{path}: invalid value {value!r} for {key} in [log]: expected one of {', '.join(choices)}")
    return key

