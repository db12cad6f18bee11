"""rounds.csv: the round table as text, one line per draft round."""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence

from kit.analysis.rounds import ROUND_COLUMNS, RoundTable


def rows_to_csv(rows: Sequence[dict]) -> str:
    """rounds.csv text: ROUND_COLUMNS, empty cells for what a method cannot know (None)."""
    if isinstance(rows, RoundTable):  # by column, one %-format per row: faster than csv.writer
        n = len(rows)
        specs, live = [], []
        for c in ROUND_COLUMNS:
            values = rows.column(c)
            nones = values.count(None)
            if n and nones == n:  # a column the method cannot know: inline empty cells
                specs.append("")
                continue
            specs.append("%s")
            live.append(["" if v is None else v for v in values] if nones else values)
        fmt = ",".join(specs)
        body = [fmt % row for row in zip(*live, strict=True)]
        return "\n".join([",".join(ROUND_COLUMNS), *body]) + "\n"
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(ROUND_COLUMNS)
    writer.writerows([r.get(c) for c in ROUND_COLUMNS] for r in rows)
    return buf.getvalue()
