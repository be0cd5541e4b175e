"""The data sets that ship with the repository, and the one way to find a data set's folder.

``benchmarks/datasets/<name>/`` holds each bundled data set (its ``SOURCE.txt`` names its origin and
licence): the BEIR-layout collections (``corpus.jsonl``, ``queries.jsonl``, ``qrels/test.tsv``;
XQuAD's also ``answers.jsonl``) and the coin photos (``manifest.jsonl`` and the JPEGs). They ship as
package data, so an installed ``mnemo bench`` finds them too. A user's own BEIR folder is named by
its path (anything with a ``/``); a bundled one by its name.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "BEIR_FILE",
    "DATASETS_DIR",
    "bundled_datasets",
    "dataset_dir",
    "document_text",
    "find_datasets",
    "read_jsonl",
]

DATASETS_DIR = Path(__file__).resolve().parent / "datasets"
BEIR_FILE = "corpus.jsonl"  # the file that makes a folder a BEIR data set


def dataset_dir(name: str, needs: str = BEIR_FILE) -> Path:
    """The folder of data set ``name`` (a bundled name such as ``adi``, or a path), holding ``needs``.

    Raises :class:`FileNotFoundError` naming the file looked for: a missing data set is never
    skipped quietly (a benchmark or test on fewer data sets than it names measures something else).
    """
    folder = Path(name) if "/" in name else DATASETS_DIR / name
    if not (folder / needs).is_file():
        raise FileNotFoundError(
            f"data set {name!r}: {folder / needs} not found (bundled data sets: "
            f"{', '.join(d.name for d in bundled_datasets()) or f'none under {DATASETS_DIR}'})"
        )
    return folder


def read_jsonl(folder: Path, name: str) -> list[dict[str, Any]]:
    """The objects of a data set's JSON-lines file ``name`` (``corpus.jsonl``, ``queries.jsonl``,
    ``manifest.jsonl``) in ``folder``, in file order."""
    lines = (folder / name).read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def document_text(doc: Mapping[str, Any]) -> str:
    """A corpus document's title and text as one text (either may be missing)."""
    return " ".join(p for p in (doc.get("title"), doc.get("text")) if p)


def bundled_datasets() -> list[Path]:
    """Every bundled BEIR data set's folder, by name."""
    return sorted(hit.parent for hit in DATASETS_DIR.glob(f"*/{BEIR_FILE}"))


def find_datasets(names: Sequence[str]) -> list[Path]:
    """The folders of BEIR data sets named or given by path; ``*``: every bundled one.

    Raises :class:`FileNotFoundError` for the first one missing (``*`` with none bundled included).
    """
    found: list[Path] = []
    for name in names:
        if name != "*":
            found.append(dataset_dir(name))
            continue
        every = bundled_datasets()
        if not every:
            raise FileNotFoundError(
                f"no bundled BEIR data set under {DATASETS_DIR} (a folder with {BEIR_FILE})"
            )
        found += [d for d in every if d not in found]
    return found
