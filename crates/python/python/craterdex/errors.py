"""The exceptions craterdex raises: one class per kind of failure, all :class:`CraterdexError`.

Each also derives from the built-in exception Python code already catches for that kind:
``InvalidInputError`` is a ``ValueError``, ``NotFoundError`` a ``LookupError``,
``CraterdexIOError`` an ``OSError``. The native module raises the class of the failure's
kind (``craterdex._native.ERROR_KINDS`` lists the kinds the engine reports).
"""

from __future__ import annotations

__all__ = [
    "CraterdexError",
    "InvalidInputError",
    "NotFoundError",
    "ConflictError",
    "CorruptDataError",
    "UnsupportedError",
    "CraterdexIOError",
    "BY_KIND",
]


class CraterdexError(Exception):
    """An error from craterdex, with the message the CLI prints. ``kind`` names its kind
    (``None`` for failures outside the kinds below)."""

    kind: "str | None" = None


class InvalidInputError(CraterdexError, ValueError):
    """Input that cannot be used as given: the message names the file or field and why."""

    kind = "invalid_input"


class NotFoundError(CraterdexError, LookupError):
    """An image id, file, index or model that is not there."""

    kind = "not_found"


class ConflictError(CraterdexError):
    """An id already in the index (or removed, and not reusable before a rebuild)."""

    kind = "conflict"


class CorruptDataError(CraterdexError):
    """Stored files that do not check out; the message names the file: rebuild or restore it."""

    kind = "corrupt"


class UnsupportedError(CraterdexError):
    """Valid, but not on this machine or build (bf16 without bf16 hardware, a search without a model)."""

    kind = "unsupported"


class CraterdexIOError(CraterdexError, OSError):
    """A read, write or download that failed."""

    kind = "io"


#: The class of each kind the engine reports.
BY_KIND = {cls.kind: cls for cls in (InvalidInputError, NotFoundError, ConflictError,
                                     CorruptDataError, UnsupportedError, CraterdexIOError)}
