"""The fsspec class behind a URL and the keyword options it takes.

A mistyped storage option must be refused, not ignored: ``LocalFileSystem`` and
``MemoryFileSystem`` accept any keyword and drop it, and s3fs hands the ones it does not know
to its botocore session, which fails with a ``TypeError`` at the first request. For the
classes whose keywords are known here (the fsspec base classes take a few, the class its own,
s3fs's session its own), an unknown key is a ``ValueError`` naming the key and the closest
known one. Other classes may pass keywords to libraries not known here and are not checked.

A protocol whose package is missing is an ``ImportError`` naming the extra to install.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
from collections.abc import Iterable, Mapping
from typing import Any

import fsspec

__all__ = ["accepted_storage_options", "check_storage_options", "filesystem_class"]

#: The extra of agentvfs that brings a protocol's package.
_EXTRAS = {"s3": "s3", "s3a": "s3", "gs": "gcs", "gcs": "gcs"}

#: Classes whose unknown keywords go only to fsspec's base classes, and to these callables
#: ("module:attribute") besides: for them the accepted keywords are known exactly.
_CHECKED: dict[str, tuple[str, ...]] = {
    "fsspec.implementations.local.LocalFileSystem": (),
    "fsspec.implementations.memory.MemoryFileSystem": (),
    "fsspec.implementations.dirfs.DirFileSystem": (),
    "s3fs.core.S3FileSystem": ("aiobotocore.session:AioSession",),
    "gcsfs.core.GCSFileSystem": (),
    "gcsfs.extended_gcsfs.ExtendedGcsFileSystem": (),
}

#: Keywords fsspec itself takes on every class: its instance cache and its listings cache.
_BASE = ("fsspec.dircache:DirCache",)
_BASE_NAMES = frozenset({"skip_instance_cache"})


def filesystem_class(protocol: str) -> type[fsspec.AbstractFileSystem]:
    """The fsspec class of ``protocol``.

    Raises
    ------
    ImportError
        Its package is not installed; the message names the ``pip install`` that brings it.
    ValueError
        fsspec knows no such protocol.
    """
    try:
        cls: type[fsspec.AbstractFileSystem] = fsspec.get_filesystem_class(protocol)
    except ImportError as exc:
        extra = _EXTRAS.get(protocol)
        how = f"pip install 'agentvfs[{extra}]'" if extra else f"install the package fsspec names: {exc}"
        raise ImportError(f"Storage {protocol}:// needs a package that is not installed; {how}") from None
    except ValueError:
        raise ValueError(
            f"Unknown storage protocol {protocol!r}: use a URL such as s3://bucket/prefix, gcs://bucket, "
            "memory:// or file:///path (any protocol fsspec knows)"
        ) from None
    return cls


def _named(fn: Any) -> set[str]:
    """The keyword-passable parameter names of ``fn`` (a function or a class's ``__init__``)."""
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # pragma: no cover - a builtin without a signature
        return set()
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return {p.name for p in parameters if p.kind in kinds and p.name != "self"}


def _resolve(target: str) -> Any | None:
    module, _, attribute = target.partition(":")
    try:
        return getattr(importlib.import_module(module), attribute)
    except (ImportError, AttributeError):  # pragma: no cover - a package layout changed
        return None


def accepted_storage_options(cls: type) -> frozenset[str] | None:
    """The storage options ``cls`` takes, or None where they are not known here (the class may
    pass keywords to a library this module does not know)."""
    passed_on = _CHECKED.get(f"{cls.__module__}.{cls.__qualname__}")
    if passed_on is None:
        return None
    names = set(_BASE_NAMES)
    for klass in cls.__mro__:
        if "__init__" in vars(klass):
            names |= _named(vars(klass)["__init__"])
    for target in (*_BASE, *passed_on):
        resolved = _resolve(target)
        if resolved is None:
            return None  # cannot tell what it takes: no check rather than a false refusal
        names |= _named(resolved)
    return frozenset(names)


def check_storage_options(
    protocol: str, options: Mapping[str, Any], *, also: Iterable[str] = (), also_called: str = ""
) -> None:
    """Refuse a protocol whose package is missing, and a key of ``options`` that the class
    of ``protocol`` does not take.

    Parameters
    ----------
    protocol : str
        The URL's protocol (``s3``, ``file``, ``memory``, ...).
    options : mapping
        The storage options.
    also : iterable of str
        Other names the caller takes beside them (a mount's options): a close one is
        suggested too, called ``also_called``.

    Raises
    ------
    ValueError
        A key is not taken; the message names it, the closest known name and what is taken.
    ImportError, ValueError
        See :func:`filesystem_class`.
    """
    cls = filesystem_class(protocol)
    if not options:
        return
    accepted = accepted_storage_options(cls)
    if accepted is None:
        return
    others = set(also)
    for key in options:
        if key in accepted:
            continue
        close = difflib.get_close_matches(key, [*accepted, *others], n=1, cutoff=0.6)
        hint = ""
        if close:
            kind = f", {also_called}" if close[0] in others and also_called else ""
            hint = f" (did you mean {close[0]!r}{kind}?)"
        raise ValueError(
            f"Unknown storage option {key!r} for {protocol}://{hint}; {cls.__name__} takes: "
            + ", ".join(sorted(accepted))
        )
