"""The daemon's configuration: Kafka's producer keys, types and defaults.

Settings are given as Kafka spells them (``-X linger.ms=10`` on the command
line, or a mapping). Unknown keys and bad values are refused with a message that
names the key, because a typo in a sidecar's settings should fail loudly at
start, not be ignored for the lifetime of the daemon.
"""

from __future__ import annotations

import difflib
import grp
import logging
import re
import ssl
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from client_stub.contract.ipc import DEFAULT_ENDPOINT
from client_stub.errors import ConfigError

from .protocol.compression import LEVEL_RANGES, CompressionType

log = logging.getLogger(__name__)

HIDDEN = "[hidden]"
INT_MAX = 2**31 - 1
LONG_MAX = 2**63 - 1

SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
# ssl.enabled.protocols' names, oldest first.
TLS_VERSIONS = {"TLSv1.2": ssl.TLSVersion.TLSv1_2, "TLSv1.3": ssl.TLSVersion.TLSv1_3}
# sasl.jaas.config's login module of each mechanism.
LOGIN_MODULES = {"PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
                 "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
                 "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule"}


def _to_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("true", "1", "yes", "on"):
        return True
    if lowered in ("false", "0", "no", "off"):
        return False
    raise ValueError(f"expected true or false, got {text!r}")


def _to_list(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()]


def _to_tls_versions(text: str) -> list[str]:
    versions = _to_list(text)
    unknown = [name for name in versions if name not in TLS_VERSIONS]
    if unknown or not versions:
        raise ValueError(f"TLS versions of {', '.join(TLS_VERSIONS)}")
    return versions


def _to_acks(text: str) -> int:
    text = text.strip().lower()
    if text == "all":
        return -1
    value = int(text)
    if value not in (-1, 0, 1):
        raise ValueError("acks must be all, -1, 0 or 1")
    return value


def _to_mode(text: str) -> int:
    """An octal file mode of read and write bits, e.g. 0660."""
    value = int(text.strip(), 8)
    if value & ~0o666:
        raise ValueError(f"a mode of read and write bits (at most 0666), got {text!r}")
    if value & 0o600 != 0o600:
        raise ValueError(f"the daemon's own user must read and write, got {text!r}")
    return value


def _to_port(text: str) -> int | None:
    """A TCP port, or empty for none."""
    text = text.strip()
    if not text:
        return None
    port = int(text)
    if not 0 < port < 65536:
        raise ValueError(f"a TCP port is 1 to 65535, got {port}")
    return port


def _to_group(text: str) -> int | None:
    """A group name or number (empty: the daemon's own group), as a gid."""
    text = text.strip()
    if not text:
        return None
    if text.isdigit():
        return int(text)
    try:
        return grp.getgrnam(text).gr_gid
    except KeyError:
        raise ValueError(f"no group named {text!r} on this host") from None


def parse_settings(pairs: list[str]) -> dict[str, str]:
    """``-X key=value`` pairs as a mapping (checked later, by ProducerConfig)."""
    settings = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ConfigError(f"-X takes key=value, got {pair!r}")
        settings[key.strip()] = value.strip()
    return settings


@dataclass(frozen=True, slots=True)
class ConfigKey:
    """One setting: its Kafka name, parser, default and allowed range; ``live`` if a running daemon takes a new
    value when it reloads its settings (SIGHUP)."""

    name: str
    parse: Callable[[str], Any]
    default: Any
    low: float | None = None
    high: float | None = None
    choices: tuple[str, ...] = ()
    doc: str = ""
    live: bool = False
    # A password or a key: shown as [hidden] (check-config, the logs), as Kafka's Password type is.
    secret: bool = False


KEYS: dict[str, ConfigKey] = {k.name: k for k in (
    ConfigKey("bootstrap.servers", _to_list, [], doc="host:port pairs to discover the cluster from"),
    ConfigKey("client.id", str, "kafka-sidecar", doc="client id sent in every request"),
    ConfigKey("acks", _to_acks, -1, doc="all (-1), 1 or 0 acknowledgements"),
    ConfigKey("linger.ms", int, 5, 0, INT_MAX, doc="how long the daemon lets a client's batch wait for more records "
              "before it claims the batch (clients may override for their own; the daemon looks at the clients' open "
              "batches at least this often; once a batch of a client lingering this long at least is due, it claims "
              "with it every batch due within this, at most once this often; a reload applies to the clients that "
              "connect after it, and to how often and how early the daemon claims at once)", live=True),
    ConfigKey("batch.size", int, 16384, 1, INT_MAX,
              doc="the size of a shared-memory block of the BufferPool, so of a batch of small records (a larger "
                  "record gets several blocks in a row)"),
    ConfigKey("buffer.memory", int, 33554432, 1, LONG_MAX,
              doc="the shared-memory BufferPool of every client process of the host together, in blocks of "
                  "batch.size; a client that finds none free waits in send() up to max.block.ms"),
    ConfigKey("max.block.ms", int, 60000, 0, LONG_MAX,
              doc="how long send() may block for memory or metadata (clients may override; a reload applies to "
                  "clients that connect after it)", live=True),
    ConfigKey("max.request.size", int, 1048576, 1, INT_MAX,
              doc="the largest produce request; send() refuses a record that cannot fit in one "
                  "(RecordTooLargeError)"),
    ConfigKey("retries", int, INT_MAX, 0, INT_MAX,
              doc="how many times a batch that failed with a retriable error is sent again (within "
                  "delivery.timeout.ms)"),
    ConfigKey("retry.backoff.ms", int, 100, 0, LONG_MAX,
              doc="the first wait before a batch is sent again, and between metadata refreshes after an error"),
    ConfigKey("retry.backoff.max.ms", int, 1000, 0, LONG_MAX,
              doc="the longest wait before a batch is sent again (the backoff doubles from retry.backoff.ms)"),
    ConfigKey("delivery.timeout.ms", int, 120000, 0, INT_MAX,
              doc="a batch not acknowledged this long after its first record was appended fails, queued or in "
                  "flight (at least linger.ms + request.timeout.ms)"),
    ConfigKey("request.timeout.ms", int, 30000, 0, INT_MAX,
              doc="a request without an answer this long fails its connection, and what was in flight on it"),
    ConfigKey("max.in.flight.requests.per.connection", int, 5, 1, INT_MAX,
              doc="requests sent to a broker and not yet answered, at most (at most 5 with idempotence); a retry "
                  "never reorders a partition"),
    ConfigKey("enable.idempotence", _to_bool, True,
              doc="a producer id and per-partition sequences, so that retries write no duplicates; needs acks=all, "
                  "retries > 0 and max.in.flight.requests.per.connection <= 5 (left at its default, it turns off "
                  "when they are not so)"),
    ConfigKey("compression.type", str, "none", choices=tuple(c.setting for c in CompressionType),
              doc="how the daemon compresses each batch before it sends it"),
    ConfigKey("compression.gzip.level", int, -1, -1, 9, doc="gzip's level, 1 to 9; -1: zlib's default (6)"),
    ConfigKey("compression.lz4.level", int, 9, *LEVEL_RANGES[CompressionType.LZ4],
              doc="9, the default, compresses with LZ4's fast compressor and any other level with LZ4 HC, "
                  "as Kafka's producer does"),
    ConfigKey("compression.zstd.level", int, 3, *LEVEL_RANGES[CompressionType.ZSTD], doc="zstd's level"),
    ConfigKey("metadata.max.age.ms", int, 300000, 0, LONG_MAX, live=True,
              doc="the cluster's metadata is fetched again at least this often, even without an error"),
    ConfigKey("allow.auto.create.topics", _to_bool, True,
              doc="let the broker create a topic the producer asks about (if the broker allows it)"),
    ConfigKey("metadata.max.idle.ms", int, 300000, 5000, LONG_MAX,
              doc="a topic no record was sent to for this long is no longer in the metadata requests"),
    ConfigKey("reconnect.backoff.ms", int, 50, 0, LONG_MAX,
              doc="the first wait before connecting to a broker again; it doubles, with jitter, up to "
                  "reconnect.backoff.max.ms"),
    ConfigKey("reconnect.backoff.max.ms", int, 1000, 0, LONG_MAX,
              doc="the longest wait before connecting to a broker again"),
    ConfigKey("socket.connection.setup.timeout.ms", int, 10000, 0, LONG_MAX,
              doc="a connection to a broker not set up this long (TCP, TLS, SASL) is closed and tried again"),
    ConfigKey("send.buffer.bytes", int, 131072, -1, INT_MAX,
              doc="the TCP send buffer of a broker connection (SO_SNDBUF); -1: the system's"),
    ConfigKey("receive.buffer.bytes", int, 32768, -1, INT_MAX,
              doc="the TCP receive buffer of a broker connection (SO_RCVBUF); -1: the system's"),
    ConfigKey("metrics.sample.window.ms", int, 30000, 1, LONG_MAX,
              doc="the window of a metric's sample: rates, averages and maxima are over the last samples"),
    ConfigKey("metrics.num.samples", int, 2, 1, INT_MAX, doc="how many samples of each metric are kept"),
    # librdkafka's name: Kafka's Java client has no cap on a response's size.
    ConfigKey("receive.message.max.bytes", int, 100000000, 1000, INT_MAX,
              doc="the largest response the daemon reads from a broker; a larger one closes the connection"),
    # The sidecar's own settings.
    ConfigKey("sidecar.endpoint", str, DEFAULT_ENDPOINT,
              doc="the ZeroMQ endpoint the daemon serves (ipc://PATH, or tcp://127.0.0.1:PORT)"),
    ConfigKey("sidecar.client.timeout.ms", int, 30000, 1000, INT_MAX,
              doc="a client silent this long is gone: what it published is claimed and sent, its other blocks "
                  "return to the pool"),
    ConfigKey("sidecar.client.reply.buffer.bytes", int, 8388608, 65536, LONG_MAX,
              doc="replies a client does not read fast enough wait in the daemon up to this many bytes (beside "
                  "what ZeroMQ queues for it); past them its session ends, its sealed batches still sent and their "
                  "reports kept for it until it connects again", live=True),
    ConfigKey("sidecar.process.max.sessions", int, 16, 1, INT_MAX,
              doc="the sessions (Producer instances connected to the daemon) one process may have at once, those "
                  "the daemon ended and keeps for it included; a process is what the kernel says it is", live=True),
    ConfigKey("sidecar.process.max.topics", int, 1000, 1, INT_MAX,
              doc="the topics the sessions of one process may produce to (each is in the daemon's metadata "
                  "requests while followed)", live=True),
    ConfigKey("sidecar.process.max.unknown.topics", int, 100, 1, INT_MAX,
              doc="of those, how many the cluster does not have (yet) one process may wait for at once", live=True),
    ConfigKey("sidecar.auto.create.topics.per.minute", int, 60, 0, INT_MAX,
              doc="with allow.auto.create.topics, how many topics the cluster does not have the daemon asks it to "
                  "create a minute, at most (a topic is first asked for without creation: only missing ones count)"),
    ConfigKey("sidecar.close.timeout.ms", int, 30000, 0, INT_MAX,
              doc="on shutdown, how long to go on sending what the clients handed off", live=True),
    ConfigKey("sidecar.socket.group", _to_group, None,
              doc="the group that may produce through the daemon: its ipc socket and its memory socket belong to "
                  "it (default: the daemon's own group)"),
    ConfigKey("sidecar.socket.mode", _to_mode, 0o660,
              doc="the mode of the ipc socket and of the memory socket, whatever the umask (octal; the sockets' "
                  "directory, when the daemon makes it, lets the same classes of user search it)"),
    ConfigKey("sidecar.metrics.port", _to_port, None,
              doc="serve the metrics in Prometheus' text format over HTTP on this port (off when unset)"),
    ConfigKey("sidecar.metrics.host", str, "127.0.0.1",
              doc="the address the metrics port is bound to (loopback: only this host may read them)"),
    ConfigKey("sidecar.compression.threads", int, 0, 0, 256,
              doc="threads that compress batches beside the event loop, for a host with cores to spare (on two "
                  "busy cores they cost more than they save: the GIL); 0: the loop compresses each request's batches "
                  "as it sends them"),
    ConfigKey("sidecar.buffer.queue.ms", int, 50, 0, INT_MAX,
              doc="while batches flow, the BufferPool's blocks that may be sealed and not yet acknowledged are what "
                  "the daemon acknowledges in this long (at least two max.request.size worth): a producer faster than "
                  "the brokers then waits in send() instead of its records waiting in the pool; 0: the whole pool, as "
                  "Java's buffer.memory"),
    ConfigKey("sidecar.coalesce.batches", _to_bool, True,
              doc="coalesce the small batches of a partition, from any clients, into one of at most batch.size "
                  "bytes when they are sent (a broker takes one batch per partition per request)"),
    ConfigKey("security.protocol", str, "PLAINTEXT", choices=SECURITY_PROTOCOLS,
              doc="how the daemon talks to the brokers: PLAINTEXT, SSL (TLS), SASL_PLAINTEXT or SASL_SSL"),
    # TLS: certificates and keys in PEM (Kafka's ssl.truststore.type and ssl.keystore.type PEM), as files or
    # inline. Read when a connection is made: a reload (SIGHUP) reads them again for the connections after it.
    ConfigKey("ssl.truststore.location", str, "", live=True,
              doc="a PEM file of the CA certificates to trust (default: the system's)"),
    ConfigKey("ssl.truststore.certificates", str, "", live=True, doc="the CA certificates to trust, as PEM text"),
    ConfigKey("ssl.keystore.location", str, "", live=True,
              doc="a PEM file of the client's private key and certificate chain (brokers that ask for one)"),
    ConfigKey("ssl.keystore.key", str, "", live=True, secret=True, doc="the client's private key, as PEM text"),
    ConfigKey("ssl.keystore.certificate.chain", str, "", live=True,
              doc="the client's certificate chain, as PEM text (with ssl.keystore.key)"),
    ConfigKey("ssl.key.password", str, "", live=True, secret=True, doc="the password of the client's private key"),
    ConfigKey("ssl.endpoint.identification.algorithm", str, "https", choices=("https", ""), live=True,
              doc="https: the broker's certificate must name the host connected to; empty: any name"),
    ConfigKey("ssl.enabled.protocols", _to_tls_versions, list(TLS_VERSIONS), live=True,
              doc="the TLS versions allowed (TLSv1.2, TLSv1.3)"),
    # SASL: Kafka's mechanisms with a password.
    ConfigKey("sasl.mechanism", str, "GSSAPI", live=True,
              doc="PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512 (GSSAPI, Kafka's default, is not supported)"),
    ConfigKey("sasl.jaas.config", str, "", live=True, secret=True,
              doc="Kafka's login module line, e.g. org.apache.kafka.common.security.scram.ScramLoginModule "
                  'required username="alice" password="...";'),
    ConfigKey("sasl.username", str, "", live=True, doc="the SASL user (librdkafka's name; or in sasl.jaas.config)"),
    ConfigKey("sasl.password", str, "", live=True, secret=True,
              doc="the SASL password (librdkafka's name; or in sasl.jaas.config)"),
)}


class ProducerConfig:
    """Validated settings; read them as ``config["linger.ms"]``."""

    def __init__(self, settings: Mapping[str, Any] | None = None) -> None:
        self._values: dict[str, Any] = {name: key.default for name, key in KEYS.items()}
        self._given: set[str] = set()
        for name, raw in (settings or {}).items():
            self._values[name] = _parse(name, raw)
            self._given.add(name)
        self._check()

    def __getitem__(self, name: str) -> Any:
        return self._values[name]

    def given(self, name: str) -> bool:
        """Whether ``name`` was set explicitly rather than left at its default."""
        return name in self._given

    def reload(self, new: ProducerConfig) -> tuple[list[str], list[str]]:
        """Take ``new``'s values of the live settings; returns the names of the settings that changed and were
        taken, and of those that changed but need a restart. Nothing is taken if the mix breaks a rule."""
        changed = [name for name in KEYS if new[name] != self[name]]
        taken = [name for name in changed if KEYS[name].live]
        before = dict(self._values)
        for name in taken:
            self._values[name] = new[name]
        try:
            self._check()
            # A rule may move a setting the running daemon read at start (delivery.timeout.ms grown to cover a
            # longer linger.ms): refused, as the daemon would go on with the old one.
            moved = [name for name in KEYS if not KEYS[name].live and self._values[name] != before[name]]
            if moved:
                raise ConfigError(f"{', '.join(f'{n}={self._values[n]}' for n in taken)} would change "
                                  f"{', '.join(moved)}, which only a restart applies")
        except ConfigError:
            self._values = before
            raise
        return taken, [name for name in changed if not KEYS[name].live]

    @property
    def idempotent(self) -> bool:
        return self._values["enable.idempotence"]

    def _check(self) -> None:
        v = self._values
        if not v["bootstrap.servers"]:
            raise ConfigError("bootstrap.servers must list at least one host:port")
        for server in v["bootstrap.servers"]:
            host, sep, port = server.rpartition(":")
            if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ConfigError(f"bootstrap.servers entry {server!r} is not host:port")
        linger_and_request_timeout = min(v["linger.ms"] + v["request.timeout.ms"], INT_MAX)
        if v["delivery.timeout.ms"] < linger_and_request_timeout:
            message = (f"delivery.timeout.ms ({v['delivery.timeout.ms']}) should be equal to or larger than "
                       f"linger.ms ({v['linger.ms']}) + request.timeout.ms ({v['request.timeout.ms']})")
            if self.given("delivery.timeout.ms"):
                raise ConfigError(message)
            # As the Java producer: only an explicit value is an error; the default grows to fit.
            log.warning("%s: setting it to %d", message, linger_and_request_timeout)
            v["delivery.timeout.ms"] = linger_and_request_timeout
        if v["reconnect.backoff.max.ms"] < v["reconnect.backoff.ms"]:
            raise ConfigError("reconnect.backoff.max.ms must not be below reconnect.backoff.ms")
        if v["batch.size"] > v["buffer.memory"]:
            raise ConfigError(f"batch.size ({v['batch.size']}) must not be above buffer.memory ({v['buffer.memory']}): "
                              "the BufferPool holds at least one batch")
        self._check_idempotence()
        self._check_security()

    def _check_security(self) -> None:
        """The TLS and SASL settings agree with each other and with security.protocol."""
        v = self._values
        protocol = v["security.protocol"]
        for one, other in (("ssl.truststore.location", "ssl.truststore.certificates"),
                           ("ssl.keystore.location", "ssl.keystore.key"),
                           ("ssl.keystore.location", "ssl.keystore.certificate.chain")):
            if v[one] and v[other]:
                raise ConfigError(f"{one} and {other} are both set: set one of them")
        if bool(v["ssl.keystore.key"]) != bool(v["ssl.keystore.certificate.chain"]):
            raise ConfigError("ssl.keystore.key and ssl.keystore.certificate.chain go together: set both or neither")
        if v["ssl.key.password"] and not (v["ssl.keystore.location"] or v["ssl.keystore.key"]):
            raise ConfigError("ssl.key.password is set, but no key (ssl.keystore.location or ssl.keystore.key)")
        if protocol.startswith("SASL_"):
            sasl_credentials(self)
        elif any(self.given(name) for name in KEYS if name.startswith("sasl.")):
            log.warning("the sasl.* settings are not used: security.protocol is %s", protocol)
        if protocol not in ("SSL", "SASL_SSL") and any(self.given(name) for name in KEYS if name.startswith("ssl.")):
            log.warning("the ssl.* settings are not used: security.protocol is %s", protocol)

    def _check_idempotence(self) -> None:
        # As the Java producer: an explicit enable.idempotence=true with a contradicting
        # setting is an error; left at its default, idempotence quietly turns off.
        v = self._values
        conflicts = []
        if v["max.in.flight.requests.per.connection"] > 5:
            conflicts.append("max.in.flight.requests.per.connection must be at most 5")
        if v["retries"] == 0:
            conflicts.append("retries must be greater than 0")
        if v["acks"] != -1:
            conflicts.append("acks must be set to all (-1)")
        if not v["enable.idempotence"] or not conflicts:
            return
        if self.given("enable.idempotence"):
            raise ConfigError("enable.idempotence=true, but " + "; ".join(conflicts)
                              + ". Change those settings or set enable.idempotence=false.")
        log.info("idempotence disabled: %s", "; ".join(conflicts))
        v["enable.idempotence"] = False


def _as_text(raw: Any) -> str:
    """A value given typed (from code) as the text it stands for: it is parsed and checked as text is."""
    if raw is None:
        raise ValueError("a value is required")
    if isinstance(raw, (list, tuple)):
        return ",".join(map(str, raw))
    return str(raw)


def _parse(name: str, raw: Any) -> Any:
    key = KEYS.get(name)
    if key is None:
        close = difflib.get_close_matches(name, KEYS, n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise ConfigError(f"unknown setting {name!r}{hint}")
    try:
        value = key.parse(raw if isinstance(raw, str) else _as_text(raw))
    except ValueError as exc:
        raise ConfigError(f"invalid value {_quoted(key, raw)} for {name}: {exc}") from None
    if key.choices and value not in key.choices:
        raise ConfigError(f"invalid value {_quoted(key, raw)} for {name}: expected one of "
                          f"{', '.join(choice or repr(choice) for choice in key.choices)}")
    if key.low is not None and value < key.low or key.high is not None and value > key.high:
        raise ConfigError(f"invalid value {raw!r} for {name}: must be in [{key.low}, {key.high}]")
    return value


def _quoted(key: ConfigKey, raw: Any) -> str:
    """A value as an error quotes it: a secret's as [hidden]."""
    return HIDDEN if key.secret else repr(raw)


def shown(name: str, value: Any) -> str:
    """A setting's value as check-config and the logs show it (a secret, set, as [hidden])."""
    if KEYS[name].secret and value:
        return HIDDEN
    if isinstance(value, list):
        return ",".join(value)
    if name == "sidecar.socket.mode":
        return f"{value:04o}"
    return "" if value is None else str(value)


# sasl.jaas.config: "<login module> required key="value" key=value ...;" (Kafka's JaasConfig syntax).
_JAAS = re.compile(r"\s*(?P<module>[\w.$]+)\s+(?:required|requisite|sufficient|optional)(?P<options>.*?);?\s*")
_JAAS_OPTION = re.compile(r'\s*(?P<key>[\w.-]+)\s*=\s*(?:"(?P<quoted>(?:[^"\\]|\\.)*)"|(?P<bare>[^\s";]+))')


def sasl_credentials(config: ProducerConfig) -> tuple[str, str]:
    """The SASL user and password, from sasl.jaas.config or sasl.username and sasl.password; ConfigError if the
    mechanism is not one the daemon speaks, or the settings are missing or contradict each other."""
    mechanism = config["sasl.mechanism"]
    if mechanism not in SASL_MECHANISMS:
        raise ConfigError(f"sasl.mechanism {mechanism} is not supported: use {', '.join(SASL_MECHANISMS)}")
    username, password = config["sasl.username"], config["sasl.password"]
    jaas = config["sasl.jaas.config"]
    if jaas:
        match = _JAAS.fullmatch(jaas)
        if match is None:
            raise ConfigError("sasl.jaas.config is not a login module line: <module> required username=\"...\" "
                              "password=\"...\";")
        if match["module"] != LOGIN_MODULES[mechanism]:
            raise ConfigError(f"sasl.jaas.config's login module {match['module']} is not {mechanism}'s "
                              f"({LOGIN_MODULES[mechanism]})")
        options = {m["key"]: m["bare"] if m["quoted"] is None else re.sub(r"\\(.)", r"\1", m["quoted"])
                   for m in _JAAS_OPTION.finditer(match["options"])}
        if (username and username != options.get("username")) or (password and password != options.get("password")):
            raise ConfigError("sasl.username or sasl.password differ from sasl.jaas.config's: set one or the other")
        username, password = options.get("username", ""), options.get("password", "")
    if not username or not password:
        raise ConfigError(f"security.protocol {config['security.protocol']} with sasl.mechanism {mechanism} needs a "
                          "user and a password: sasl.jaas.config, or sasl.username and sasl.password")
    return username, password
