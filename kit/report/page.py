"""The report as a page a reviewer reads top-down: the ladder's overview, then each rung (what ran, its
headline, narrow tables, figures with their source), exported from the executed notebook to one HTML file
that needs no network (no scripts, images inlined) and shows no code, prompts or execution counts."""

from __future__ import annotations

import html
import io
import numbers
from pathlib import Path
from typing import Any

import nbformat
from matplotlib.figure import Figure

from kit.errors import ExistsError
from kit.report.rung import NO_RUNS, NOT_CONFIRMED, Plot, Rung, Table

DPI = 100
CSS = """
body { margin: 0; background: #fff; color: #1b1b1b;
       font: 15px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif; }
main { max-width: 1280px; margin: 0 auto; padding: 20px 32px 64px; box-sizing: border-box; }
a.anchor-link, .jp-Collapser, .jp-InputPrompt, .jp-OutputPrompt { display: none; }
h1 { font-size: 26px; margin: 8px 0 12px; }
h2 { font-size: 21px; margin: 36px 0 8px; padding-top: 16px; border-top: 2px solid #d8d8d8; }
h3 { font-size: 16px; margin: 18px 0 6px; }
code { background: #f2f2f2; padding: 0 3px; border-radius: 3px; font-size: 90%; }
pre { white-space: pre-wrap; }
img { max-width: 100%; height: auto; display: block; }
.kit-headline { font-size: 16px; margin: 8px 0 10px; padding: 8px 12px; border-left: 6px solid #999;
                background: #f6f6f6; }
.kit-headline.kit-ok { border-color: #2e8b45; }
.kit-headline.kit-bad { border-color: #c0392b; }
.kit-headline.kit-info { border-color: #4c72b0; }
.kit-status { font-weight: 700; }
.kit-ok .kit-status { color: #1e7b34; }
.kit-bad .kit-status { color: #b00020; }
dl.kit-about { display: grid; grid-template-columns: max-content auto; gap: 1px 14px; margin: 6px 0 10px;
               font-size: 14px; }
dl.kit-about dt { font-weight: 600; color: #444; }
dl.kit-about dd { margin: 0; }
table.kit { border-collapse: collapse; font-size: 13px; margin: 4px 0 16px; }
table.kit th, table.kit td { border: 1px solid #d0d0d0; padding: 3px 8px; text-align: left;
                             vertical-align: top; }
table.kit th { background: #f0f0f0; font-weight: 600; }
table.kit:not(.kit-overview) td { white-space: nowrap; }
table.kit td.num { text-align: right; font-variant-numeric: tabular-nums; }
table.kit:not(.kit-overview) td.kit-prose { white-space: normal; min-width: 24em; max-width: 60em; }
table.kit td.kit-fail { background: #fde2e1; color: #b00020; font-weight: 700; }
table.kit-overview td { font-size: 14px; }
.kit-caption { font-size: 13px; color: #555; margin: 2px 0 18px; }
"""


def _fmt(value: Any) -> tuple[str, bool]:
    """A cell as text and whether it is a number: no NaN, no None, booleans in words."""
    if value is None or (isinstance(value, float) and value != value):
        return "-", False
    if isinstance(value, bool) or type(value).__name__ == "bool_":
        return ("yes" if value else "no"), False
    if isinstance(value, numbers.Integral):
        return f"{int(value):,}", True
    if isinstance(value, numbers.Real):
        return f"{float(value):.4g}", True
    return str(value), False


PROSE = 120  # a cell longer than this is a sentence (a survivor's why): it wraps, the page stays narrow


def table_html(table: Table) -> str:
    """A narrow table: no index column, '-' for a missing value, numbers right-aligned, sentences wrapped,
    the cells it marks (a check that fails there) in red."""
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in table.frame.columns)
    rows = []
    for i, values in enumerate(table.frame.itertuples(index=False)):
        cells = []
        for column, v in zip(table.frame.columns, values, strict=True):
            text, num = _fmt(v)
            prose, failing = len(text) > PROSE, (i, column) in table.marked
            flags = (("num", num), ("kit-prose", prose), ("kit-fail", failing))
            classes = " ".join(c for c, on in flags if on)
            cells.append(
                f'<td class="{classes}">{html.escape(text)}</td>'
                if classes
                else f"<td>{html.escape(text)}</td>"
            )
        rows.append(f"<tr>{''.join(cells)}</tr>")
    note = f'<p class="kit-caption">{html.escape(table.note)}</p>' if table.note else ""
    return (
        f"<h3>{html.escape(table.title)}</h3>"
        f'<table class="kit"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>{note}'
    )


def _tone(status: str) -> str:
    if not status:
        return "kit-info"
    return "kit-bad" if status.startswith((NOT_CONFIRMED, NO_RUNS)) else "kit-ok"


def headline_html(rung: Rung) -> str:
    status = f'<span class="kit-status">{html.escape(rung.status)}</span>: ' if rung.status else ""
    return (
        f'<p class="kit-headline {_tone(rung.status)}">{html.escape(rung.scope)}: {status}'
        f"{html.escape(rung.claim)}</p>"
    )


def about_html(about: dict[str, str]) -> str:
    items = "".join(
        f"<dt>{html.escape(k)}</dt><dd>{html.escape(v)}</dd>" for k, v in about.items() if k != "short"
    )
    return f'<dl class="kit-about">{items}</dl>'


def overview_html(ladder: list[Rung]) -> str:
    """The top of the page: every rung in order, what ran and its headline, before any detail."""
    rows = "".join(
        f"<tr><td>{i}</td><td>{html.escape(r.title)}</td><td>{html.escape(r.about.get('short', ''))}<br>"
        f"{html.escape(r.about.get('Nsight', ''))}</td><td>{headline_html(r)}</td></tr>"
        for i, r in enumerate(ladder, 1)
    )
    return (
        '<table class="kit kit-overview"><thead><tr><th>#</th><th>evidence, strongest first</th>'
        f"<th>what ran</th><th>headline</th></tr></thead><tbody>{rows}</tbody></table>"
    )


def plot_png(plot: Plot) -> bytes:
    """The figure as PNG bytes (drawn without pyplot: no global state, nothing shown twice); saved to
    `plot.save_as` as well when set."""
    if plot.png is not None:
        return Path(plot.png).read_bytes()
    fig = Figure(figsize=plot.size, dpi=DPI, layout="constrained")
    plot.draw(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI)
    data = buf.getvalue()
    if plot.save_as is not None:
        Path(plot.save_as).write_bytes(data)
    return data


def rung_parts(rung: Rung, number: int | None = None) -> list[tuple[str, Any]]:
    """One rung as ("html" | "markdown" | "png", content) parts, in page order."""
    title = f"{number} · {rung.title}" if number else rung.title
    parts: list[tuple[str, Any]] = [
        (
            "html",
            f'<h2 id="{rung.key}">{html.escape(title)}</h2>{headline_html(rung)}{about_html(rung.about)}',
        )
    ]
    if rung.note:
        parts.append(("markdown", rung.note))
    parts += [("html", table_html(t)) for t in rung.tables]
    for plot in rung.plots:
        parts += [
            ("html", f"<h3>{html.escape(plot.title)}</h3>"),
            ("png", plot_png(plot)),
            ("html", f'<p class="kit-caption">Source: {html.escape(plot.source)}</p>'),
        ]
    return parts


def show(parts: list[tuple[str, Any]]) -> None:
    """Display the parts in a notebook: HTML, Markdown and PNG outputs, nothing else."""
    from IPython.display import HTML, Image, Markdown, display

    kinds = {"html": HTML, "markdown": Markdown, "png": lambda data: Image(data=data, format="png")}
    for kind, content in parts:
        display(kinds[kind](content))


_TEMPLATE = """{%- extends 'lab/index.html.j2' -%}
{%- block header -%}
<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1.0">
<title>{{ resources.kit_title | e }}</title>
<style>{{ resources.kit_css }}</style>
</head>
{%- endblock header -%}
"""


def _templates_beside(module_file: str) -> list[str]:
    """nbconvert installed with `pip --target DIR` (an offline GPU host's staged wheels) keeps its templates
    in DIR/share/jupyter/nbconvert/templates, where nbconvert itself does not look: name that folder."""
    here = Path(module_file).resolve().parents[1] / "share" / "jupyter" / "nbconvert" / "templates"
    return [str(here)] if here.is_dir() else []


def export_html(executed: Path, out_html: Path, title: str) -> Path:
    """The executed report notebook as one page: outputs and narrative only (no code, no prompts), the
    kit's own head (its title, its CSS; no require.js, MathJax or Mermaid from a CDN), images inlined."""
    import nbconvert
    from jinja2 import DictLoader
    from nbconvert import HTMLExporter

    if out_html.exists():
        raise ExistsError(f"{out_html} already exists: refusing to overwrite it", path=out_html)
    staged = _templates_beside(nbconvert.__file__)
    exporter = HTMLExporter(
        extra_loaders=[DictLoader({"kit_report.html.j2": _TEMPLATE})],
        extra_template_basedirs=staged,
        extra_template_paths=staged,
        template_file="kit_report.html.j2",
        exclude_input=True,
        exclude_input_prompt=True,
        exclude_output_prompt=True,
        embed_images=True,
    )
    nb = nbformat.read(executed, as_version=4)
    body, _ = exporter.from_notebook_node(nb, resources={"kit_title": title, "kit_css": CSS})
    out_html.write_text(body)
    return out_html
