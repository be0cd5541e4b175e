"""Helpers shared by the image-layer tests: where the coins data set is, the coin section, records."""

from __future__ import annotations

from typing import Any

from benchmarks.datasets import dataset_dir

IMAGE_MODEL = "tiny-siglip-random"
COINS = dataset_dir("coins", "manifest.jsonl")  # the 96 bundled coin photos (benchmarks/datasets/coins)

COIN_SECTION: dict[str, Any] = {
    "embed": [{"id": "card", "contributors": ["numd1"]}],
    "context": {
        "images": [{"tipo": "numd5", "view": "obverse"}, {"tipo": "numd6", "view": "reverse"}],
        "metadata": {"denomination": "numd10", "material": "numd30", "period": "numd20"},
        "compare_scope": ["coins1"],
    },
}
