from hypothesis import given
from hypothesis import strategies as st

from index.text import fold


def test_accents_and_case_fold() -> None:
    assert fold("Pantáno") == fold("pantano") == "pantano"
    assert fold("Straße ÆON Øre") == "strasse aeon ore"
    assert fold("Ñandú") == "nandu"
    assert fold("东京 ÇA") == "东京 ca"


@given(st.text())
def test_fold_is_idempotent(text: str) -> None:
    assert fold(fold(text)) == fold(text)
