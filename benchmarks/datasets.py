"""Where the bundled BEIR-layout data sets are found (``benchmarks/datasets``, ``../shared/datasets``)."""

from __future__ import annotations

from pathlib import Path

__all__ = ["DATASET_ROOTS", "find_datasets"]

REPO_ROOT = Path(__file__).resolve().parent.parent
# Where bundled BEIR-layout data sets are looked for, in order.
# ../shared/datasets beside the checkout, or beside a folder above it (a git worktree under wt/).
DATASET_ROOTS = (
    REPO_ROOT / "benchmarks" / "datasets",
    *(root / "shared" / "datasets" for root in REPO_ROOT.parents),
)


def find_datasets(
    names: tuple[str, ...], roots: tuple[Path, ...] = DATASET_ROOTS
) -> tuple[list[Path], list[str]]:
    """(directories found, names not found) for BEIR data set names or paths; ``*``: every one found."""
    found, missing = [], []
    for name in names:
        if name == "*":
            seen = {d.name for d in found}
            for root in roots:
                for hit in sorted(root.glob("*/corpus.jsonl")) if root.is_dir() else ():
                    if hit.parent.name not in seen:
                        seen.add(hit.parent.name)
                        found.append(hit.parent)
            continue
        candidates = [Path(name)] if "/" in name else [root / name for root in roots]
        hit = next((c for c in candidates if (c / "corpus.jsonl").is_file()), None)
        if hit is None:
            missing.append(f"{name} (looked in {', '.join(str(c) for c in candidates)})")
        else:
            found.append(hit)
    return found, missing
