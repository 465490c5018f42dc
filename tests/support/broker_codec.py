"""The broker's half of the Kafka codec: requests decoded, responses encoded.

The sidecar only encodes requests and decodes responses (service.protocol.api);
the fake broker and the fault-injecting proxy of the tests need the other half,
built here on the same API table and message classes.
"""

from __future__ import annotations

from dataclasses import dataclass

from client_stub.contract.records import Buffer
from service.protocol import primitives as prim
from service.protocol.api import APIS, REQUEST_HEADER
from service.protocol.schema import Message


@dataclass(frozen=True, slots=True)
class RequestHeader:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None


def peek_request_header(frame: Buffer, offset: int = 0) -> tuple[int, int, int]:
    """(api key, api version, correlation id) that start every request frame (at ``offset``), whatever
    its version: for those that only route or count requests."""
    if len(frame) - offset < REQUEST_HEADER.size:
        raise prim.ProtocolError("request shorter than its header")
    return REQUEST_HEADER.unpack_from(frame, offset)


def read_request_header(frame: Buffer, header_version: int) -> tuple[RequestHeader, int]:
    """A request header of ``header_version`` at the start of ``frame``, and the position after it."""
    api_key, api_version, correlation_id = peek_request_header(frame)
    client_id, pos = None, REQUEST_HEADER.size
    if header_version >= 1:
        client_id, pos = prim.read_string(frame, pos)
    if header_version >= 2:
        pos = prim.skip_tagged_fields(frame, pos)
    return RequestHeader(api_key, api_version, correlation_id, client_id), pos


def decode_request(frame: Buffer) -> tuple[RequestHeader, Message]:
    """Decode a request frame (without its size prefix): for test brokers and proxies."""
    api_key, version, _ = peek_request_header(frame)
    api = APIS.get(api_key)
    if api is None:
        raise prim.ProtocolError(f"unknown api key {api_key}")
    header, pos = read_request_header(frame, api.request_header_version(version))
    return header, api.request.decode(frame, version, pos)


def encode_response(body: Message, version: int, correlation_id: int) -> bytes:
    """A size-prefixed response: for test brokers and proxies."""
    api = APIS[body.API_KEY]
    w = prim.Writer()
    w.buf += prim.INT32.pack(correlation_id)
    if api.response_header_version(version) >= 1:
        w.buf.append(0)
    body.encode_into(w, version)
    data = w.getvalue()
    return prim.INT32.pack(len(data)) + data
