"""Record classes (a small subset of :mod:`dataclasses`) without its import cost.

``import dataclasses`` pulls in :mod:`inspect` and, with it, ``ast``, ``dis`` and
``tokenize``: about 15 ms before the first class, and about 1 ms per class after. Every
``stockade run`` pays for the classes of the policy and the plans, and the CLI has a
start-up budget of 60 ms, so the modules on that path use :func:`record` instead.

It supports what stockade uses: keyword or positional construction in field order,
defaults and ``field(default_factory=...)``, frozen instances (the default), ``__eq__``,
``__hash__`` (frozen only), ``__repr__``, and the helpers :func:`replace`,
:func:`fields` and :func:`asdict`. Type checkers see it as a dataclass
(``dataclass_transform``).
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any, TypeVar, dataclass_transform

    _T = TypeVar("_T")
else:  # the decorator only carries information for type checkers

    def dataclass_transform(**_kwargs):  # type: ignore[no-untyped-def]
        return lambda fn: fn


class FrozenInstanceError(AttributeError):
    """Raised when a field of a frozen record is assigned or deleted."""


_MISSING: Any = object()
_FIELDS = "__record_fields__"


class _Field:
    __slots__ = ("default", "factory")

    def __init__(self, default: Any, factory: Any) -> None:
        self.default = default
        self.factory = factory


def field(*, default: Any = _MISSING, default_factory: Callable[[], Any] = _MISSING) -> Any:
    """A field with a default value or a factory for one (as :func:`dataclasses.field`)."""
    return _Field(default, default_factory)


def _frozen_setattr(self: object, name: str, value: object) -> None:
    raise FrozenInstanceError(f"cannot assign to field {name!r} of a frozen record")


def _frozen_delattr(self: object, name: str) -> None:
    raise FrozenInstanceError(f"cannot delete field {name!r} of a frozen record")


def _build(cls: type[_T], frozen: bool) -> type[_T]:
    names: list[str] = []
    defaults: dict[str, Any] = {}
    for klass in reversed(cls.__mro__):
        # Each class's own annotations; inspect.get_annotations would import inspect.
        for name, annotation in klass.__dict__.get("__annotations__", {}).items():  # noqa: RUF063
            if str(annotation).startswith(("ClassVar", "typing.ClassVar")):
                continue
            if name not in names:
                names.append(name)
            if name in klass.__dict__:
                defaults[name] = klass.__dict__[name]
    params: list[str] = []
    body: list[str] = []
    scope: dict[str, Any] = {"_MISSING": _MISSING}
    setter = "object.__setattr__(self, {!r}, {})" if frozen else "self.{} = {}"
    seen_default = False
    for name in names:
        value = defaults.get(name, _MISSING)
        if isinstance(value, _Field) and value.factory is not _MISSING:
            scope[f"_f_{name}"] = value.factory
            params.append(f"{name}=_MISSING")
            expr = f"_f_{name}() if {name} is _MISSING else {name}"
            seen_default = True
        else:
            if isinstance(value, _Field):
                value = value.default
            if value is _MISSING:
                if seen_default:
                    raise TypeError(
                        f"{cls.__name__}: field {name!r} without a default follows one with a default"
                    )
                params.append(name)
            else:
                scope[f"_d_{name}"] = value
                params.append(f"{name}=_d_{name}")
                seen_default = True
            expr = name
        body.append(setter.format(name, expr))
        if isinstance(cls.__dict__.get(name), _Field):
            delattr(cls, name)  # a field() marker is not a usable class attribute
    source = f"def __init__(self, {', '.join(params)}):\n    " + "\n    ".join(body or ["pass"])
    if not names:
        source = "def __init__(self):\n    pass"
    exec(source, scope)  # noqa: S102 - generated from field names only, like dataclasses
    init = scope["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"

    def __repr__(self: Any) -> str:
        inner = ", ".join(f"{n}={getattr(self, n)!r}" for n in names)
        return f"{type(self).__qualname__}({inner})"

    def __eq__(self: Any, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return all(getattr(self, n) == getattr(other, n) for n in names)

    def __hash__(self: Any) -> int:
        return hash(tuple(getattr(self, n) for n in names))

    methods: dict[str, Any] = {
        "__init__": init,
        _FIELDS: tuple(names),
        "__match_args__": tuple(names),
        "__repr__": __repr__,
        "__eq__": __eq__,
    }
    if frozen:
        methods.update(__hash__=__hash__, __setattr__=_frozen_setattr, __delattr__=_frozen_delattr)
    else:
        methods["__hash__"] = None  # mutable and compared by value: unhashable, like dataclasses
    for attr, value in methods.items():
        setattr(cls, attr, value)
    return cls


@dataclass_transform(frozen_default=True, field_specifiers=(field,))
def record(cls: type[_T] | None = None, /, *, frozen: bool = True) -> Any:
    """Make ``cls`` a record: ``@record`` (frozen) or ``@record(frozen=False)``."""
    if cls is None:
        return lambda c: _build(c, frozen)
    return _build(cls, frozen)


def fields(obj: object) -> tuple[str, ...]:
    """The field names of a record (class or instance), in order."""
    names: tuple[str, ...] = getattr(obj, _FIELDS)
    return names


def replace(obj: _T, /, **changes: Any) -> _T:
    """A copy of the record ``obj`` with some fields changed."""
    values = {name: getattr(obj, name) for name in fields(obj)}
    unknown = set(changes) - set(values)
    if unknown:
        raise TypeError(f"{type(obj).__name__} has no field {sorted(unknown)[0]!r}")
    values.update(changes)
    return type(obj)(**values)


def asdict(obj: object) -> dict[str, Any]:
    """The record ``obj`` as a dict, records inside it converted too."""

    def convert(value: Any) -> Any:
        if hasattr(value, _FIELDS):
            return {n: convert(getattr(value, n)) for n in fields(value)}
        if isinstance(value, list | tuple):
            return type(value)(convert(v) for v in value)
        if isinstance(value, dict):
            return {k: convert(v) for k, v in value.items()}
        return value

    result: dict[str, Any] = convert(obj)
    return result
