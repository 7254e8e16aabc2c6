"""Exceptions raised by cohort.

Every error the library reports carries its status code (``status``, a
negative integer, and ``code``, its name such as ``"EINVAL"``), the request
field it concerns when there is one (``field``) and the whole msgpack
response (``response``). Subclasses also derive from the matching builtin
exception, so ``except ValueError`` catches a bad argument.
"""

import builtins


class CohortError(RuntimeError):
    """An error reported by cohort (or found before calling it)."""

    def __init__(self, message, status=-1, code="EINVAL", field=None, response=None):
        super().__init__(message)
        self.message = message
        self.status = status
        self.code = code
        self.field = field or None
        self.response = response

    def __str__(self):
        return "[%s] %s" % (self.code, self.message)


class InvalidArgumentError(CohortError, ValueError):
    """EINVAL: a bad argument (wrong type, size, dtype, layout, handle)."""


class DtypeError(InvalidArgumentError, TypeError):
    """An array whose dtype cohort does not reduce."""


class UnsupportedError(CohortError, NotImplementedError):
    """EUNSUPPORTED: not available in this build."""


class TimeoutError(CohortError, builtins.TimeoutError):  # noqa: A001 - mirrors the builtin
    """ETIMEDOUT (no progress for timeout_ms) or a wait that ran out of time."""


class PeerError(CohortError):
    """EPEER: a peer was lost."""


class MismatchError(CohortError):
    """EMISMATCH: ranks disagree on the arguments of a collective."""


class CanceledError(CohortError):
    """ECANCELED: the request was canceled (the context was finalized)."""


class StateError(CohortError):
    """ESTATE: the object is in the wrong state (not initialized, finalized)."""


class BootstrapError(CohortError):
    """EBOOTSTRAP / EAUTH: the ranks could not meet."""


_BY_CODE = {
    "EINVAL": InvalidArgumentError,
    "EUNSUPPORTED": UnsupportedError,
    "ETIMEDOUT": TimeoutError,
    "EAGAIN": TimeoutError,
    "EPEER": PeerError,
    "EMISMATCH": MismatchError,
    "ECANCELED": CanceledError,
    "ESTATE": StateError,
    "EBOOTSTRAP": BootstrapError,
    "EAUTH": BootstrapError,
}


def from_response(resp, what=None):
    """The exception for a failed msgpack response."""
    code = resp.get("code", "EINTERNAL")
    msg = resp.get("error") or code
    if what:
        msg = "%s: %s" % (what, msg)
    cls = _BY_CODE.get(code, CohortError)
    return cls(msg, resp.get("status", -1), code, resp.get("field"), resp)
