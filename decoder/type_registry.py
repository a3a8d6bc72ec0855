"""The types of one database: enums, domains, composites, arrays, ranges and multiranges.

Their OIDs are the database's own; :func:`decoder.types.load_types` reads them from its
catalog into a :class:`TypeRegistry`, which builds their text decoders from the parsers of
:mod:`decoder.text_parsers` (and :class:`~decoder.binary.BinaryDecoders` their binary ones
from the :class:`TypeShape` of each), besides the built-in types' own.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

from decoder.generation import GenerationCache
from decoder.text_parsers import (
    BUILTIN_DECODERS,
    TextDecoder,
    array_decoder,
    composite_decoder,
    multirange_decoder,
    range_decoder,
    type_name,
)

_Build = Callable[[Callable[[int], TextDecoder]], TextDecoder]
_Derived = TypeVar("_Derived")


@dataclass(frozen=True, slots=True)
class TypeShape:
    """How a registered type is built from others, for decoders of other formats
    (decoder/binary.py builds the binary ones from it).

    ``kind`` is ``enum``, ``domain``, ``array``, ``composite``, ``range``,
    ``multirange``, ``base`` (an extension's type with a decoder of its own) or
    ``text`` (no decoder); ``of`` is the base, element or subtype OID; ``fields``
    the composite's (name, type OID) pairs; ``name`` the type's name; ``typmod`` a
    domain's (its base type's modifier: ``numeric(10,2)``).
    """

    kind: str
    of: int = 0
    fields: tuple[tuple[str, int], ...] = ()
    name: str | None = None
    typmod: int = -1


class TypeRegistry:
    """Decoders for the built-in types and for the types registered from one database.

    Custom OIDs belong to one database, so a registry serves one database;
    :func:`decoder.types.load_types` fills one from its catalog.  A registered
    type refers to others by OID; they may be registered in any order, and a
    reference to an OID the registry does not know decodes as text.  Decoders
    are built by :meth:`decoder_for` (once per OID, not per value) and do no
    lookups when they run.

    What is built from the registered types (its text decoders, the binary ones of
    decoder/binary.py) is kept in caches of :meth:`derived`, which every registration
    drops: a new type may complete an object built before it.
    """

    __slots__ = ("_builds", "_names", "_shapes", "_derived", "_decoders", "_building")

    def __init__(self) -> None:
        self._builds: dict[int, _Build] = {}
        self._names: dict[int, str] = {}
        self._shapes: dict[int, TypeShape] = {}
        self._derived: list[GenerationCache[int, Any]] = []
        self._building: set[int] = set()  # the types being built: a cycle decodes as text
        self._decoders = self.derived(self._build_decoder)

    def derived(self, build: Callable[[int], _Derived]) -> GenerationCache[int, _Derived]:
        """A cache of objects ``build(type OID)`` makes from the registered types, dropped
        whenever a type is registered."""
        cache: GenerationCache[int, _Derived] = GenerationCache(build)
        self._derived.append(cache)
        return cache

    def register_enum(self, oid: int, *, name: str | None = None) -> None:
        """An enum: its value is its label."""
        self._register(oid, name, lambda resolve: str, TypeShape("enum", name=name))

    def register_domain(self, oid: int, base_oid: int, *, name: str | None = None,
                        typmod: int = -1) -> None:
        """A domain: a value of its base type (itself perhaps a domain), with ``typmod``."""
        self._register(oid, name, lambda resolve: resolve(base_oid),
                       TypeShape("domain", base_oid, name=name, typmod=typmod))

    def register_array(self, oid: int, element_oid: int, *, delimiter: str = ",",
                       name: str | None = None) -> None:
        """An array: nested lists of its element type (``delimiter`` is the element's typdelim)."""
        self._register(oid, name, lambda resolve: array_decoder(resolve(element_oid), delimiter),
                       TypeShape("array", element_oid, name=name))

    def register_composite(self, oid: int, fields: Iterable[tuple[str, int]], *,
                           name: str | None = None) -> None:
        """A composite: a dict of its fields (name, type OID), in attribute order."""
        fields = tuple(fields)
        self._register(oid, name, lambda resolve: composite_decoder(
            tuple((field, resolve(field_oid)) for field, field_oid in fields)),
            TypeShape("composite", fields=fields, name=name))

    def register_range(self, oid: int, subtype_oid: int, *, name: str | None = None) -> None:
        """A range: a :class:`Range` whose bounds are values of its subtype."""
        self._register(oid, name, lambda resolve: range_decoder(resolve(subtype_oid)),
                       TypeShape("range", subtype_oid, name=name))

    def register_multirange(self, oid: int, subtype_oid: int, *, name: str | None = None) -> None:
        """A multirange: a tuple of ranges over ``subtype_oid`` (the subtype of its range)."""
        self._register(oid, name, lambda resolve: multirange_decoder(resolve(subtype_oid)),
                       TypeShape("multirange", subtype_oid, name=name))

    def register_base(self, oid: int, decode: TextDecoder, *, name: str | None = None) -> None:
        """A base type of an extension with a decoder of its own (decoder/extensions.py)."""
        self._register(oid, name, lambda resolve: decode, TypeShape("base", name=name))

    def register_text(self, oid: int, *, name: str | None = None) -> None:
        """A type whose value stays its text (an extension's base type, say), with its name."""
        self._register(oid, name, lambda resolve: str, TypeShape("text", name=name))

    def _register(self, oid: int, name: str | None, build: _Build, shape: TypeShape) -> None:
        self._builds[oid] = build
        self._shapes[oid] = shape
        if name is not None:
            self._names[oid] = name
        for built in self._derived:  # a new type may complete an object built before
            built.invalidate()

    def shape(self, oid: int) -> TypeShape | None:
        """How a registered type is built; ``None`` for built-in and unknown types."""
        return self._shapes.get(oid)

    def domain_base(self, oid: int) -> tuple[int, int] | None:
        """The base type OID and typmod of a registered domain; None for any other type."""
        shape = self._shapes.get(oid)
        return (shape.of, shape.typmod) if shape is not None and shape.kind == "domain" \
            else None

    def __contains__(self, oid: object) -> bool:
        return oid in BUILTIN_DECODERS or oid in self._builds

    def decoder_for(self, type_oid: int) -> TextDecoder:
        """The text decoder of a type; ``str`` for a type the registry does not know."""
        decode = BUILTIN_DECODERS.get(type_oid)
        if decode is not None:
            return decode
        if type_oid not in self._builds or type_oid in self._building:
            return str  # unknown, or a cycle the catalog cannot have
        return self._decoders.get(type_oid)

    def _build_decoder(self, oid: int) -> TextDecoder:
        self._building.add(oid)
        try:
            return self._builds[oid](self.decoder_for)
        finally:
            self._building.discard(oid)

    def type_name(self, type_oid: int) -> str:
        return self._names.get(type_oid) or type_name(type_oid)
