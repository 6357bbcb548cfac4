"""Merge kernel tuning tables: ``merge_tuning.py BASE NEW OUT`` — NEW's entries replace BASE's
for the same shape (kind, group, T, dk, batch, L); provenance lists are concatenated. A missing
NEW (the sweep ran out of time before writing it) leaves BASE as it is."""

from __future__ import annotations

import json
import sys
from pathlib import Path


def key(e: dict) -> tuple:
    return (e["kind"], e["group"], e["T"], e["dk"], e["batch"], e["L"])


def main() -> int:
    base_p, new_p, out_p = map(Path, sys.argv[1:4])
    base = json.loads(base_p.read_text())
    new = json.loads(new_p.read_text()) if new_p.exists() else {"entries": []}
    merged = {key(e): e for e in base["entries"]}
    merged.update({key(e): e for e in new["entries"]})
    out = dict(base)
    out["entries"] = [merged[k] for k in sorted(merged)]
    out["provenance"] = list(base.get("provenance", [])) + list(new.get("provenance", []))
    out_p.write_text(json.dumps(out, indent=1) + "\n")
    print(f"{len(base['entries'])} + {len(new['entries'])} -> {len(out['entries'])} entries")
    return 0


if __name__ == "__main__":
    sys.exit(main())
