"""Helpers shared by the image-layer tests: where the coins data set is, the coin section, records."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.conftest import REPO_ROOT

IMAGE_MODEL = "tiny-siglip-random"


def _find_coins() -> Path:
    # The repository's `shared/` sits beside the checkout (or beside the folder of worktrees).
    for base in (REPO_ROOT, REPO_ROOT.parent, REPO_ROOT.parent.parent):
        candidate = base / "shared" / "datasets" / "coins"
        if (candidate / "manifest.jsonl").is_file():
            return candidate
    raise FileNotFoundError("the coins data set (shared/datasets/coins) is not beside this checkout")


COINS = _find_coins()

COIN_SECTION: dict[str, Any] = {
    "embed": [{"id": "card", "contributors": ["numd1"]}],
    "context": {
        "images": [{"tipo": "numd5", "view": "obverse"}, {"tipo": "numd6", "view": "reverse"}],
        "metadata": {"denomination": "numd10", "material": "numd30", "period": "numd20"},
        "compare_scope": ["coins1"],
    },
}
