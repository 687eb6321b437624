"""Values that come from a request body or a peer's message: untrusted, so each is taken only in
a form and range this engine's own settings allow."""
from __future__ import annotations


def bounded_seconds(value: object, cap: float, default: float | None = None) -> float:
    """A peer's number of seconds kept in [0, cap] (cap: this engine's own setting): a larger one
    is cap, a negative one 0, anything that is not a number (NaN, a string, a bool, None) the
    default (cap unless given)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        return cap if default is None else default
    return min(max(float(value), 0.0), cap)
