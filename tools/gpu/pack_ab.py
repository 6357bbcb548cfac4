"""Pack the verify bench rows of a device call's A/B runs into one gzipped CSV for ``data/``.

    python3 tools/gpu/pack_ab.py OUT.csv.gz CALL=DIR [CALL=DIR ...]

``DIR`` is what ``tools/gpu/ab_envs.sh`` (``v<i>_<round>/``) or ``tools/gpu/ab_defines.sh``
(``v<i>r<round>/``) wrote, with its ``variants.txt``, or one plain bench output directory (its
``verify_attention.csv``). Every row keeps the bench's columns and gains ``call`` (the name
given), ``side`` (``v0``, ``v1``, ...; ``run`` for a plain directory), ``round`` and
``variant`` (the side's environment or defines, from ``variants.txt``), the columns
:func:`kdtree.nb_shipped.ab_commits_table` reads.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pandas as pd

_RUN = re.compile(r"^(v\d+)(?:_|r)(\d+)$")


def call_rows(call: str, root: Path) -> pd.DataFrame:
    """The rows of one call's directory ``root`` (see the module's docstring)."""
    if (root / "verify_attention.csv").exists():
        df = pd.read_csv(root / "verify_attention.csv")
        return df.assign(call=call, side="run", round=1, variant="")
    listing = root / "variants.txt"
    if not listing.exists():
        raise SystemExit(f"{root}: neither verify_attention.csv nor variants.txt")
    variants = {}
    for line in listing.read_text().splitlines():
        side, _, what = line.partition(" ")
        variants[side] = what.strip()
    parts = []
    for sub in sorted(p for p in root.iterdir() if p.is_dir()):
        m = _RUN.match(sub.name)
        csv = sub / "verify_attention.csv"
        if m is None or not csv.exists():
            continue
        side, rnd = m.group(1), int(m.group(2))
        parts.append(pd.read_csv(csv).assign(call=call, side=side, round=rnd,
                                             variant=variants.get(side, "")))  # fmt: skip
    if not parts:
        raise SystemExit(f"{root}: no v<i>_<round> / v<i>r<round> runs with rows")
    return pd.concat(parts, ignore_index=True)


def main(argv: list[str]) -> None:
    if len(argv) < 2 or not argv[0].endswith(".csv.gz"):
        raise SystemExit(__doc__)
    frames = []
    for spec in argv[1:]:
        call, sep, d = spec.partition("=")
        if not sep:
            raise SystemExit(f"{spec!r}: expected CALL=DIR")
        frames.append(call_rows(call, Path(d)))
    out = pd.concat(frames, ignore_index=True)
    out.to_csv(argv[0], index=False, compression="gzip")
    print(f"{argv[0]}: {len(out)} rows, calls {sorted(out['call'].unique())}")


if __name__ == "__main__":
    main(sys.argv[1:])
