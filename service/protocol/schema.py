"""A schema-driven codec for Kafka messages.

Messages are declared with :func:`field` the way Kafka's JSON message schemas
declare them (clients/src/main/resources/common/message/ in apache/kafka): a
type, the versions a field exists in, nullable versions, tagged fields. From a
declaration this module builds a class per struct and, for every valid version,
an encoder and a decoder compiled from generated Python source. The generated
code is straight-line: consecutive fixed-width fields are packed and unpacked by
one precompiled ``struct.Struct`` and nothing is interpreted per field at run
time, which keeps the produce path fast and new versions cheap.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from client_stub.contract.records import Buffer

from . import primitives as prim

_FIXED_FORMATS = {"int8": "b", "int16": "h", "int32": "i", "int64": "q", "uint16": "H",
                  "float64": "d", "bool": "?", "uuid": "16s"}
_VARIABLE = {"string", "bytes", "records"}


@dataclass(frozen=True, slots=True)
class Versions:
    """A version range as the schemas write it: "3+", "0-8", "none"."""

    low: int
    high: float

    @classmethod
    def parse(cls, text: str | None) -> Versions:
        if text is None or text == "none":
            return cls(0, -1)
        if text.endswith("+"):
            return cls(int(text[:-1]), math.inf)
        low, _, high = text.partition("-")
        return cls(int(low), int(high or low))

    def __contains__(self, version: int) -> bool:
        return self.low <= version <= self.high


_MISSING: Any = object()


@dataclass(frozen=True, slots=True)
class Field:
    """One field of a message or struct."""

    name: str
    type: str
    versions: Versions
    nullable: Versions
    default: Any
    tag: int | None
    tagged: Versions
    fields: tuple[Field, ...]

    @property
    def is_array(self) -> bool:
        return self.type.startswith("[]")

    @property
    def element(self) -> str:
        return self.type[2:] if self.is_array else self.type

    @property
    def is_struct(self) -> bool:
        return bool(self.fields)


def field(name: str, type: str, versions: str = "0+", *, nullable: str | None = None,
          default: Any = _MISSING, tag: int | None = None, tagged: str | None = None,
          fields: Sequence[Field] = ()) -> Field:
    """Declare a field; arguments follow the JSON schema's keys."""
    return Field(name, type, Versions.parse(versions), Versions.parse(nullable), default, tag,
                 Versions.parse(tagged), tuple(fields))


class Struct:
    """Base of the generated message and struct classes: keyword construction, equality, repr."""

    __slots__ = ()
    _fields: ClassVar[tuple[str, ...]] = ()
    # The declarations the class was built from, for tools and the schema tests.
    _schema_fields: ClassVar[tuple[Field, ...]] = ()
    _defaults: ClassVar[dict[str, Callable[[], Any]]] = {}

    def __init__(self, **values: Any) -> None:
        # Replaced in every generated class by a compiled keyword-only __init__ (see _make_init).
        raise TypeError("Struct is abstract")

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return all(getattr(self, n) == getattr(other, n) for n in self._fields)

    def __repr__(self) -> str:
        inner = ", ".join(f"{n}={getattr(self, n)!r}" for n in self._fields)
        return f"{type(self).__name__}({inner})"


class Message(Struct):
    """A top-level request or response with per-version encoders and decoders."""

    __slots__ = ()
    API_KEY: ClassVar[int]
    VALID_VERSIONS: ClassVar[Versions]
    FLEXIBLE_VERSIONS: ClassVar[Versions]
    _encoders: ClassVar[dict[int, Callable[[prim.Writer, Any], None]]]
    _decoders: ClassVar[dict[int, Callable[[Buffer, int], tuple[Any, int]]]]

    @classmethod
    def min_version(cls) -> int:
        return cls.VALID_VERSIONS.low

    @classmethod
    def max_version(cls) -> int:
        return int(cls.VALID_VERSIONS.high)

    @classmethod
    def is_flexible(cls, version: int) -> bool:
        return version in cls.FLEXIBLE_VERSIONS

    def encode_into(self, w: prim.Writer, version: int) -> None:
        """Append this message's body at ``version`` to ``w``."""
        try:
            encoder = self._encoders[version]
        except KeyError:
            raise prim.ProtocolError(f"{type(self).__name__} has no version {version}") from None
        encoder(w, self)

    def encode(self, version: int) -> bytes:
        """This message's body at ``version`` as bytes."""
        w = prim.Writer()
        self.encode_into(w, version)
        return w.getvalue()

    @classmethod
    def decode(cls, data: Buffer, version: int, pos: int = 0, *, strict: bool = True) -> Any:
        """Decode a body at ``version`` that fills ``data`` from ``pos`` to its end.

        ``strict=False`` ignores bytes after the message, as the Java client does.
        """
        try:
            decoder = cls._decoders[version]
        except KeyError:
            raise prim.ProtocolError(f"{cls.__name__} has no version {version}") from None
        try:
            message, end = decoder(data, pos)
        except (struct.error, IndexError, UnicodeDecodeError, ValueError) as exc:
            raise prim.ProtocolError(f"cannot decode {cls.__name__} v{version}: {exc}") from exc
        if strict and end != len(data):
            raise prim.ProtocolError(
                f"{cls.__name__} v{version}: {len(data) - end} unexpected bytes after the message")
        return message


def _default_factory(f: Field, struct_classes: dict[str, type[Struct]]) -> Callable[[], Any]:
    if f.is_array:
        if f.default is None:
            return lambda: None
        return list
    if f.is_struct:
        cls = struct_classes[f.type]
        return cls
    value = f.default
    if value is _MISSING:
        value = {"string": "", "bytes": b"", "records": None, "bool": False, "uuid": prim.ZERO_UUID,
                 "float64": 0.0}.get(f.type, 0)
    return lambda: value


class _Compiler:
    """Generates and compiles the encoder and decoder of one struct at one version."""

    def __init__(self, message_name: str) -> None:
        self.message_name = message_name
        self.namespace: dict[str, Any] = {"prim": prim, "_new": object.__new__}
        self.cache: dict[tuple[int, int], tuple[str, str]] = {}
        self.counter = 0

    def constant(self, value: Any, hint: str) -> str:
        self.counter += 1
        name = f"_{hint}{self.counter}"
        self.namespace[name] = value
        return name

    def compile(self, cls: type[Struct], fields: tuple[Field, ...], version: int,
                flexible: bool) -> tuple[str, str]:
        key = (id(cls), version)
        if key not in self.cache:
            stem = f"{cls.__name__}_v{version}"
            self.cache[key] = (f"enc_{stem}", f"dec_{stem}")
            self._emit_encoder(cls, fields, version, flexible)
            self._emit_decoder(cls, fields, version, flexible)
        return self.cache[key]

    # -- encoding --------------------------------------------------------------------------

    def _emit_encoder(self, cls: type[Struct], fields: tuple[Field, ...], version: int,
                      flexible: bool) -> None:
        name = self.cache[(id(cls), version)][0]
        lines = [f"def {name}(w, o):", "    b = w.buf"]
        present = [f for f in fields if version in f.versions and version not in f.tagged]
        for group in _groups(present):
            lines += self._encode_group(cls, group, version, flexible, "w", "b", "    ")
        if flexible:
            tagged = sorted((f for f in fields if version in f.tagged and version in f.versions),
                            key=lambda f: f.tag)
            if tagged:
                lines.append("    tags = []")
                for f in tagged:
                    default = self.constant(cls._defaults[f.name], "default")
                    lines.append(f"    if o.{f.name} != {default}():")
                    lines.append("        tw = prim.Writer()")
                    lines.append("        tb = tw.buf")
                    lines += self._encode_group(cls, [f], version, flexible, "tw", "tb", "        ")
                    lines.append(f"        tags.append(({f.tag}, tw.getvalue()))")
                lines.append("    prim.write_tagged_fields(w.buf, tags)")
            else:
                lines.append("    w.buf.append(0)")
        self._define("\n".join(lines))

    def _encode_group(self, cls: type[Struct], group: list[Field], version: int, flexible: bool,
                      w: str, b: str, indent: str) -> list[str]:
        first = group[0]
        if first.type in _FIXED_FORMATS and not first.is_array:
            packer = self.constant(struct.Struct(">" + "".join(_FIXED_FORMATS[f.type] for f in group)),
                                   "pack")
            args = ", ".join(f"o.{f.name}" for f in group)
            # Numbers are never nullable. Which one is None is looked for only once packing failed.
            out = [f"{indent}try:", f"{indent}    {b} += {packer}.pack({args})", f"{indent}except prim.struct.error:"]
            for f in group:
                out += self._null_check(cls, f, f"o.{f.name}", version, indent + "    ")
            return out + [f"{indent}    raise"]
        f = first
        out = [f"{indent}v = o.{f.name}"]
        if version not in f.nullable:
            out += self._null_check(cls, f, "v", version, indent)
        if f.is_array:
            out.append(f"{indent}prim.write_array_length({b}, v, {flexible})")
            out.append(f"{indent}if v:")
            out.append(f"{indent}    for x in v:")
            out += self._encode_value(cls, f, "x", version, flexible, w, b, indent + "        ")
            if f.is_struct:
                out.append(f"{indent}    {b} = {w}.buf")
        else:
            out += self._encode_value(cls, f, "v", version, flexible, w, b, indent)
        return out

    def _null_check(self, cls: type[Struct], f: Field, v: str, version: int, indent: str) -> list[str]:
        """Raise a ProtocolError if ``v`` is None: as Java's generated writers, never write null where
        the version does not allow it (it would be read back as an empty or absent value)."""
        where = f.name if cls.__name__ == self.message_name else f"{cls.__name__}.{f.name}"
        message = f"{self.message_name} v{version}: {where} is None, but not nullable in this version"
        return [f"{indent}if {v} is None:", f"{indent}    raise prim.ProtocolError({message!r}) from None"]

    def _encode_value(self, cls: type[Struct], f: Field, v: str, version: int, flexible: bool,
                      w: str, b: str, indent: str) -> list[str]:
        t = f.element
        if f.is_struct:
            sub = getattr(cls, t)
            enc, _ = self.compile(sub, f.fields, version, flexible)
            return [f"{indent}{enc}({w}, {v})"] + ([] if f.is_array else [f"{indent}{b} = {w}.buf"])
        if t in _FIXED_FORMATS:
            packer = self.constant(struct.Struct(">" + _FIXED_FORMATS[t]), "pack")
            return [f"{indent}{b} += {packer}.pack({v})"]
        if t == "records":
            return [f"{indent}prim.write_records({w}, {v}, {flexible})", f"{indent}{b} = {w}.buf"]
        writer = {"string": "write_string", "bytes": "write_bytes"}[t]
        if flexible:
            writer = writer.replace("write_", "write_compact_")
        return [f"{indent}prim.{writer}({b}, {v})"]

    # -- decoding --------------------------------------------------------------------------

    def _emit_decoder(self, cls: type[Struct], fields: tuple[Field, ...], version: int,
                      flexible: bool) -> None:
        name = self.cache[(id(cls), version)][1]
        cls_ref = self.constant(cls, "cls")
        lines = [f"def {name}(d, p):", f"    o = _new({cls_ref})"]
        present = [f for f in fields if version in f.versions and version not in f.tagged]
        for f in fields:
            if f not in present:
                default = self.constant(cls._defaults[f.name], "default")
                lines.append(f"    o.{f.name} = {default}()")
        for group in _groups(present):
            lines += self._decode_group(cls, group, version, flexible, "    ")
        if flexible:
            tagged = [f for f in fields if version in f.tagged and version in f.versions]
            if tagged:
                lines.append("    tags, p = prim.read_tagged_fields(d, p)")
                for f in tagged:
                    lines.append(f"    if {f.tag} in tags:")
                    lines.append(f"        td = tags[{f.tag}]")
                    lines += self._decode_group(cls, [f], version, flexible, "        ",
                                                data="td", pos="tp", start="0")
            else:
                lines.append("    p = prim.skip_tagged_fields(d, p)")
        lines.append("    return o, p")
        self._define("\n".join(lines))

    def _decode_group(self, cls: type[Struct], group: list[Field], version: int, flexible: bool,
                      indent: str, data: str = "d", pos: str = "p", start: str | None = None) -> list[str]:
        out = [] if start is None else [f"{indent}{pos} = {start}"]
        first = group[0]
        if first.type in _FIXED_FORMATS and not first.is_array:
            unpacker = struct.Struct(">" + "".join(_FIXED_FORMATS[f.type] for f in group))
            ref = self.constant(unpacker, "unpack")
            targets = ", ".join(f"o.{f.name}" for f in group)
            out.append(f"{indent}{targets}, = {ref}.unpack_from({data}, {pos})")
            out.append(f"{indent}{pos} += {unpacker.size}")
            return out
        f = first
        if f.is_array:
            out.append(f"{indent}n, {pos} = prim.read_array_length({data}, {pos}, {flexible})")
            out.append(f"{indent}if n < 0:")
            out.append(f"{indent}    o.{f.name} = None")
            out.append(f"{indent}elif n > len({data}) - {pos}:")
            out.append(f"{indent}    raise prim.ProtocolError('array of ' + str(n) + ' elements overruns the message')")
            out.append(f"{indent}else:")
            t = f.element
            if t in _FIXED_FORMATS:
                size = struct.calcsize(">" + _FIXED_FORMATS[t])
                out.append(f"{indent}    o.{f.name} = list(prim.struct.unpack_from("
                           f"'>' + str(n) + '{_FIXED_FORMATS[t]}', {data}, {pos}))")
                out.append(f"{indent}    {pos} += n * {size}")
            else:
                out.append(f"{indent}    a = o.{f.name} = []")
                out.append(f"{indent}    for _ in range(n):")
                out += self._decode_value(cls, f, "x", version, flexible, indent + "        ", data, pos)
                out.append(f"{indent}        a.append(x)")
            return out
        out += self._decode_value(cls, f, f"o.{f.name}", version, flexible, indent, data, pos)
        return out

    def _decode_value(self, cls: type[Struct], f: Field, target: str, version: int, flexible: bool,
                      indent: str, data: str, pos: str) -> list[str]:
        t = f.element
        if f.is_struct:
            _, dec = self.compile(getattr(cls, t), f.fields, version, flexible)
            return [f"{indent}{target}, {pos} = {dec}({data}, {pos})"]
        if t in _FIXED_FORMATS:
            unpacker = struct.Struct(">" + _FIXED_FORMATS[t])
            ref = self.constant(unpacker, "unpack")
            return [f"{indent}{target}, = {ref}.unpack_from({data}, {pos})",
                    f"{indent}{pos} += {unpacker.size}"]
        reader = {"string": "read_string", "bytes": "read_bytes", "records": "read_bytes"}[t]
        if flexible:
            reader = reader.replace("read_", "read_compact_")
        return [f"{indent}{target}, {pos} = prim.{reader}({data}, {pos})"]

    def _define(self, source: str) -> None:
        exec(compile(source, f"<kafka-sidecar codec {self.message_name}>", "exec"), self.namespace)

    def function(self, name: str) -> Callable[..., Any]:
        return self.namespace[name]


def _groups(fields: list[Field]) -> list[list[Field]]:
    """Split fields into runs: consecutive fixed-width scalars together, everything else alone."""
    groups: list[list[Field]] = []
    for f in fields:
        fixed = f.type in _FIXED_FORMATS and not f.is_array
        if fixed and groups and groups[-1][0].type in _FIXED_FORMATS and not groups[-1][0].is_array:
            groups[-1].append(f)
        else:
            groups.append([f])
    return groups


def _make_struct_class(name: str, fields: tuple[Field, ...], base: type[Struct]) -> type[Struct]:
    cls = type(name, (base,), {"__slots__": tuple(f.name for f in fields)})
    cls._fields = tuple(f.name for f in fields)
    cls._schema_fields = fields
    defaults: dict[str, Callable[[], Any]] = {}
    for f in fields:
        if f.is_struct:
            setattr(cls, f.element, _make_struct_class(f.element, f.fields, Struct))
        defaults[f.name] = _default_factory(f, {f.element: getattr(cls, f.element, None)})
    cls._defaults = defaults
    cls.__init__ = _make_init(cls)  # type: ignore[method-assign]
    return cls


_UNSET: Any = object()


def _make_init(cls: type[Struct]) -> Callable[..., None]:
    """A keyword-only __init__ for ``cls``, compiled: requests are built per send, so it is hot."""
    if not cls._fields:
        return lambda self: None
    namespace: dict[str, Any] = {"_UNSET": _UNSET, "_defaults": cls._defaults}
    params = ", ".join(f"{name}=_UNSET" for name in cls._fields)
    body = "\n".join(f"    self.{name} = _defaults[{name!r}]() if {name} is _UNSET else {name}"
                     for name in cls._fields)
    exec(compile(f"def __init__(self, *, {params}):\n{body}\n", f"<kafka-sidecar {cls.__name__}>", "exec"),
         namespace)
    init = namespace["__init__"]
    init.__qualname__ = f"{cls.__name__}.__init__"
    return init


def message(name: str, api_key: int, valid_versions: str, flexible_versions: str,
            fields: Sequence[Field]) -> type[Message]:
    """Build the class of a request or response with a compiled codec per valid version."""
    fields = tuple(fields)
    cls = _make_struct_class(name, fields, Message)
    cls.API_KEY = api_key
    cls.VALID_VERSIONS = Versions.parse(valid_versions)
    cls.FLEXIBLE_VERSIONS = Versions.parse(flexible_versions)
    compiler = _Compiler(name)
    cls._encoders, cls._decoders = {}, {}
    for version in range(cls.VALID_VERSIONS.low, int(cls.VALID_VERSIONS.high) + 1):
        enc, dec = compiler.compile(cls, fields, version, version in cls.FLEXIBLE_VERSIONS)
        cls._encoders[version] = compiler.function(enc)
        cls._decoders[version] = compiler.function(dec)
    return cls
