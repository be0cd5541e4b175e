"""Text normalization shared by indexing and querying (the two must fold identically)."""

from __future__ import annotations

import unicodedata

# Letters that NFKD does not decompose into base + combining mark.
_EXTRA_FOLDS = str.maketrans(
    {
        "ß": "ss",
        "æ": "ae",
        "Æ": "ae",
        "œ": "oe",
        "Œ": "oe",
        "ø": "o",
        "Ø": "o",
        "đ": "d",
        "Đ": "d",
        "ł": "l",
        "Ł": "l",
        "ı": "i",
        "þ": "th",
        "Þ": "th",
    }
)


def fold(text: str) -> str:
    """Lower-case and strip accents: "Pantáno" -> "pantano", "Straße" -> "strasse".

    PostgreSQL's ``unaccent`` is not available in the embedded server, so the
    lexical column is folded here and queries are folded the same way.
    CJK and other scripts without combining marks pass through unchanged.
    """
    decomposed = unicodedata.normalize("NFKD", text.translate(_EXTRA_FOLDS))
    stripped = "".join(ch for ch in decomposed if not unicodedata.combining(ch))
    return unicodedata.normalize("NFC", stripped).lower()
