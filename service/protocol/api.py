"""Request and response framing: the API table, headers and size prefixes.

A request on the wire is ``INT32 size`` + request header + body; a response is
``INT32 size`` + response header + body. Header versions follow the body:
flexible bodies use request header v2 and response header v1, except that an
ApiVersions response always has header v0 so that a client can read it before
it knows which versions the broker speaks.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from client_stub.contract.records import Buffer

from . import messages as m
from . import primitives as prim
from .schema import Message


@dataclass(frozen=True, slots=True)
class Api:
    """One Kafka API: its key, name and the versions this client implements."""

    key: int
    name: str
    request: type[Message]
    response: type[Message]

    @property
    def min_version(self) -> int:
        return self.request.min_version()

    @property
    def max_version(self) -> int:
        return self.request.max_version()

    def request_header_version(self, version: int) -> int:
        # Header v0 is ControlledShutdown v0's alone in Kafka, an API the sidecar does not send.
        return 2 if self.request.is_flexible(version) else 1

    def response_header_version(self, version: int) -> int:
        if self.key == m.API_VERSIONS:
            return 0
        return 1 if self.response.is_flexible(version) else 0


APIS: dict[int, Api] = {api.key: api for api in (
    Api(m.PRODUCE, "Produce", m.ProduceRequest, m.ProduceResponse),
    Api(m.METADATA, "Metadata", m.MetadataRequest, m.MetadataResponse),
    Api(m.SASL_HANDSHAKE, "SaslHandshake", m.SaslHandshakeRequest, m.SaslHandshakeResponse),
    Api(m.API_VERSIONS, "ApiVersions", m.ApiVersionsRequest, m.ApiVersionsResponse),
    Api(m.INIT_PRODUCER_ID, "InitProducerId", m.InitProducerIdRequest, m.InitProducerIdResponse),
    Api(m.SASL_AUTHENTICATE, "SaslAuthenticate", m.SaslAuthenticateRequest, m.SaslAuthenticateResponse),
)}


# What starts every request header, whatever its version: api key, api version, correlation id.
REQUEST_HEADER = struct.Struct(">hhi")


def write_request_header(buf: bytearray, header_version: int, api_key: int, api_version: int,
                         correlation_id: int, client_id: str | None) -> None:
    """Request header v0 (no ClientId: ``client_id`` is not written), v1, or v2 (tagged fields)."""
    buf += REQUEST_HEADER.pack(api_key, api_version, correlation_id)
    if header_version >= 1:
        # ClientId stays a non-compact nullable string even in header v2.
        prim.write_string(buf, client_id)
    if header_version >= 2:
        buf.append(0)  # no tagged fields


def encode_request(body: Message, version: int, correlation_id: int,
                   client_id: str | None) -> list[Buffer]:
    """A size-prefixed request as buffers ready for ``socket.sendmsg``.

    Record data in the body stays in the caller's buffers (no copy).
    """
    api = APIS[body.API_KEY]
    w = prim.Writer()
    buf = w.buf
    buf += prim.INT32.pack(0)  # the size, patched below
    write_request_header(buf, api.request_header_version(version), api.key, version, correlation_id, client_id)
    body.encode_into(w, version)
    parts = w.finish()
    size = sum(p.nbytes if isinstance(p, memoryview) else len(p) for p in parts) - 4
    parts[0][0:4] = prim.INT32.pack(size)
    return parts


def peek_correlation_id(frame: Buffer, offset: int = 0) -> int:
    """The correlation id that starts every response frame (at ``offset``)."""
    if len(frame) - offset < 4:
        raise prim.ProtocolError("response shorter than its header")
    return prim.INT32.unpack_from(frame, offset)[0]


def decode_response(frame: Buffer, api_key: int, version: int, *, strict: bool = True) -> Message:
    """Decode a response frame (without its size prefix) to ``api_key`` at ``version``.

    ``strict=False`` ignores bytes after the body (some brokers add some).
    """
    api = APIS[api_key]
    pos = 4
    if api.response_header_version(version) >= 1:
        pos = prim.skip_tagged_fields(frame, pos)
    return api.response.decode(frame, version, pos, strict=strict)
