"""Render validation results: human text, one JSON document, or GitHub workflow annotations.

All three take the same input, a list of :class:`FileResult` (a report, or the reason the file
could not be read), so ``dsgen validate a.json b.json`` prints every file in one go and pipelines
get a single JSON document for any number of files.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from dsgen.validate.findings import Finding, Report

FORMATS: tuple[str, ...] = ("human", "json", "github")
JSON_FORMAT_VERSION = 1


@dataclass(frozen=True)
class FileResult:
    """What happened to one input file: a report, or the load error (exit code 2)."""

    source: str
    report: Report | None = None
    error: str | None = None
    error_line: int | None = None


def render(results: list[FileResult], fmt: str) -> str:
    if fmt == "json":
        return render_json(results)
    if fmt == "github":
        return render_github(results)
    return render_human(results)


# -- human -------------------------------------------------------------------------------------
def _location(source: str, finding: Finding) -> str:
    if finding.line is not None:
        return f"{source}:{finding.line}:{finding.column}"
    return source


def render_human(results: list[FileResult]) -> str:
    lines: list[str] = []
    errors = warnings = unreadable = 0
    for result in results:
        if result.error is not None:
            unreadable += 1
            lines.append(result.error if result.error.startswith(result.source) else f"{result.source}: {result.error}")
            continue
        assert result.report is not None
        for finding in result.report.findings:
            where = f" (at {finding.pointer})" if finding.line is None and finding.pointer else ""
            lines.append(
                f"{_location(result.source, finding)}: {finding.severity}: {finding.message}{where} [{finding.rule_id}]"
            )
            if finding.hint:
                lines.append(f"    hint: {finding.hint}")
        errors += len(result.report.errors)
        warnings += len(result.report.warnings)
    lines.append(_summary(len(results), errors, warnings, unreadable))
    return "\n".join(lines)


def _summary(files: int, errors: int, warnings: int, unreadable: int) -> str:
    def count(n: int, word: str) -> str:
        return f"{n} {word}{'' if n == 1 else 's'}"

    parts = [count(errors, "error"), count(warnings, "warning")]
    if unreadable:
        parts.append(f"{unreadable} unreadable")
    verdict = "no problems found" if not (errors or warnings or unreadable) else ", ".join(parts)
    return f"checked {count(files, 'file')}: {verdict}"


# -- json --------------------------------------------------------------------------------------
def render_json(results: list[FileResult]) -> str:
    files: list[dict[str, Any]] = []
    errors = warnings = unreadable = 0
    for result in results:
        if result.error is not None:
            unreadable += 1
            files.append({"source": result.source, "ok": False, "load_error": result.error, "findings": []})
            continue
        assert result.report is not None
        files.append(result.report.to_dict())
        errors += len(result.report.errors)
        warnings += len(result.report.warnings)
    document = {
        "format_version": JSON_FORMAT_VERSION,
        "ok": not (errors or unreadable),
        "summary": {"files": len(results), "errors": errors, "warnings": warnings, "unreadable": unreadable},
        "files": files,
    }
    return json.dumps(document, indent=2)


# -- GitHub annotations ------------------------------------------------------------------------
def _escape_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(text: str) -> str:
    return _escape_data(text).replace(":", "%3A").replace(",", "%2C")


def render_github(results: list[FileResult]) -> str:
    """``::error file=...,line=...,col=...,title=...::message`` lines for GitHub Actions."""
    lines: list[str] = []
    for result in results:
        if result.error is not None:
            where = f",line={result.error_line}" if result.error_line else ""
            lines.append(
                f"::error file={_escape_property(result.source)}{where},title=dsgen::{_escape_data(result.error)}"
            )
            continue
        assert result.report is not None
        for finding in result.report.findings:
            props = [f"file={_escape_property(result.source)}"]
            if finding.line is not None:
                props += [f"line={finding.line}", f"col={finding.column}"]
            props.append(f"title={_escape_property('dsgen ' + finding.rule_id)}")
            text = finding.message + (f" (hint: {finding.hint})" if finding.hint else "")
            lines.append(f"::{finding.severity} {','.join(props)}::{_escape_data(text)}")
    return "\n".join(lines)
