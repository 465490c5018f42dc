"""FrontSettings: what the front reads of the daemon's configuration."""

from __future__ import annotations

from dataclasses import dataclass

from client_stub.contract import ipc

from ..config import ProducerConfig


@dataclass(frozen=True, slots=True)
class FrontSettings:
    """The settings the front works with; made anew from the configuration when it is reloaded."""

    # What each WELCOME tells a client.
    welcome: ipc.WelcomeSettings
    max_request_size: int
    # sidecar.client.*: how long a client may be silent, and how much of its replies may wait for it.
    client_timeout_ms: int
    reply_buffer_bytes: int
    # sidecar.process.max.*: what one process may hold, whatever the number of its sessions.
    max_sessions_per_process: int
    max_topics_per_process: int
    max_unknown_topics_per_process: int

    @classmethod
    def from_config(cls, config: ProducerConfig, block_size: int, block_count: int) -> FrontSettings:
        """The front's settings of ``config``, for a BufferPool of ``block_count`` blocks of ``block_size``."""
        client_timeout_ms = config["sidecar.client.timeout.ms"]
        welcome = ipc.WelcomeSettings(
            max_request_size=config["max.request.size"], linger_ms=config["linger.ms"],
            max_block_ms=config["max.block.ms"], delivery_timeout_ms=config["delivery.timeout.ms"],
            buffer_memory=block_count * block_size, heartbeat_interval_ms=max(client_timeout_ms // 10, 100),
            batch_size=block_size,
            # The others added later, each the Kafka setting of its name (a client checks its own against them).
            **{name: config[name.replace("_", ".")] for name in ipc.WelcomeSettings._field_defaults
               if name != "batch_size"})
        return cls(welcome, config["max.request.size"], client_timeout_ms,
                   config["sidecar.client.reply.buffer.bytes"], config["sidecar.process.max.sessions"],
                   config["sidecar.process.max.topics"], config["sidecar.process.max.unknown.topics"])
