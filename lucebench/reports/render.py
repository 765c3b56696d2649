"""Markdown and static HTML rendering of tables, environment blocks and plots.

The HTML is one self-contained file (inline CSS, no scripts, no server) that references the PNGs by
relative path, so a report folder can be uploaded as a CI artifact or opened from disk.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from jinja2 import Environment, select_autoescape

from lucebench.reports.plots import Plot
from lucebench.reports.tables import Table


@dataclass
class EnvBlock:
    """The environment of one result, as (key, value) rows, with a synthetic-weights flag for the banner."""

    title: str
    rows: list[tuple[str, str]]
    synthetic: bool = False


@dataclass
class Page:
    """Everything one report page shows."""

    title: str
    subtitle: str = ""
    environments: list[EnvBlock] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)
    plots: list[Plot] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # Shown after the results and plots: what to read the numbers with (noisy, contaminated, failed cells).
    caveats: list[Table] = field(default_factory=list)


def _md_escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def table_markdown(table: Table) -> str:
    """One table as GitHub-flavoured Markdown (with its title and notes)."""
    lines = [f"## {table.title}", ""]
    lines.append("| " + " | ".join(_md_escape(h) for h in table.headers) + " |")
    lines.append("|" + "|".join("---" for _ in table.headers) + "|")
    for row in table.rows:
        lines.append("| " + " | ".join(_md_escape(c) for c in row) + " |")
    for note in table.notes:
        lines += ["", f"_{note}_"]
    return "\n".join(lines) + "\n"


def page_markdown(page: Page) -> str:
    """The whole page as Markdown, the result first: title, notes, result tables, plots, then the caveats
    (noisy, contaminated and failed cells) and the environment."""
    out = [f"# {page.title}", ""]
    if page.subtitle:
        out += [page.subtitle, ""]
    for note in page.notes:
        out += [f"> {note}", ""]
    if any(env.synthetic for env in page.environments):
        out += ["> **synthetic weights**: some cells use random-weight models; speeds are real, outputs are not.", ""]
    for table in page.tables:
        out.append(table_markdown(table))
    if page.plots:
        out += ["## Plots", ""]
        for p in page.plots:
            out += [f"### {p.title}", "", f"![{p.title}]({p.file})", "", f"_{p.caption}_", ""]
    for table in page.caveats:
        out.append(table_markdown(table))
    for env in page.environments:
        out += [f"## Environment: {env.title}", ""]
        out += ["| | |", "|---|---|"] + [f"| {_md_escape(k)} | {_md_escape(v)} |" for k, v in env.rows] + [""]
    return "\n".join(out).rstrip() + "\n"


_HTML = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{{ page.title }}</title>
<style>
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1200px; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 4px 8px; text-align: left; }
th { background: #f0f0f0; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
.banner { background: #fff3cd; border: 1px solid #e0c36c; padding: 0.5em 1em; }
.note { color: #555; font-style: italic; }
figure { display: inline-block; margin: 0 1em 1.5em 0; }
figure img { max-width: 100%; border: 1px solid #ddd; }
</style>
</head>
<body>
<h1>{{ page.title }}</h1>
{% if page.subtitle %}<p>{{ page.subtitle }}</p>{% endif %}
{% for note in page.notes %}<p class="banner">{{ note }}</p>{% endfor %}
{% if page.environments | selectattr("synthetic") | list %}<p class="banner"><strong>synthetic weights</strong>: some
cells use random-weight models; speeds are real, outputs are not.</p>{% endif %}
{% for t in page.tables %}
<h2 id="{{ t.key }}">{{ t.title }}</h2>
<table>
<tr>{% for h in t.headers %}<th>{{ h }}</th>{% endfor %}</tr>
{% for row in t.rows %}<tr>{% for c in row %}<td{% if c[:1].isdigit() %} class="num"{% endif %}>{{ c }}</td>{% endfor %}</tr>
{% endfor %}</table>
{% for n in t.notes %}<p class="note">{{ n }}</p>{% endfor %}
{% endfor %}
{% if page.plots %}<h2>Plots</h2>{% endif %}
{% for p in page.plots %}
<figure><img src="{{ p.file }}" alt="{{ p.title }}"><figcaption>{{ p.title }}: {{ p.caption }}</figcaption></figure>
{% endfor %}
{% for t in page.caveats %}
<h2 id="{{ t.key }}">{{ t.title }}</h2>
<table>
<tr>{% for h in t.headers %}<th>{{ h }}</th>{% endfor %}</tr>
{% for row in t.rows %}<tr>{% for c in row %}<td>{{ c }}</td>{% endfor %}</tr>
{% endfor %}</table>
{% for n in t.notes %}<p class="note">{{ n }}</p>{% endfor %}
{% endfor %}
{% for env in page.environments %}
<h2>Environment: {{ env.title }}</h2>
<table>{% for k, v in env.rows %}<tr><th>{{ k }}</th><td>{{ v }}</td></tr>{% endfor %}</table>
{% endfor %}
</body>
</html>
"""

_env = Environment(autoescape=select_autoescape(default=True), trim_blocks=True, lstrip_blocks=True)
_template = _env.from_string(_HTML)


def page_html(page: Page) -> str:
    """The whole page as a static HTML document (values escaped; images by relative path)."""
    return _template.render(page=page)


def tables_only(tables: Sequence[Table]) -> str:
    """Several tables as Markdown, for printing in a terminal or a PR comment."""
    return "\n".join(table_markdown(t) for t in tables)
