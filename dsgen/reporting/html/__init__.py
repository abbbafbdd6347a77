"""Self-contained HTML reports (``explain --html``, ``frontier --html``, a sweep's ``report.html``).

Each page is one file: inline CSS, inline SVG charts (:mod:`dsgen.reporting.html.charts`), a few lines of
inline script for sorting, and no network. Every number shown is one the command's ``--json`` (or
the sweep's ``manifest.jsonl``) carries, written beside it as ``data-json``/``data-value`` so a
browser test can hold the page to the JSON.
"""
