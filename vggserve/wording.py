"""Counts in messages: "1 image", "2 images", "0 errors", never "1 images"."""


def noun(n: float, singular: str, plural: str | None = None) -> str:
    """`singular` for exactly 1, else `plural` (default: `singular` + "s")."""
    return singular if n == 1 else (plural or singular + "s")


def count(n: float, singular: str, plural: str | None = None, spec: str = "") -> str:
    """`n` (formatted with `spec`, e.g. "," for 1,000) and its noun: count(1, "image") == "1 image"."""
    return f"{n:{spec}} {noun(n, singular, plural)}"
