"""Render findings as text, JSON or GitHub Actions workflow commands.

* ``text``: one ``path:line:column: RULE: message`` line per finding, then a summary line;
* ``json``: one object, ``{"findings": [...], "summary": {...}}`` (shape in ``docs/compat.md``);
* ``github``: one ``::error file=…,line=…,col=…,title=RULE::message`` annotation per finding,
  then the summary line.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from smg_grpc_proto.compat._model import Finding, Level

Format = Literal["text", "json", "github"]
FORMATS: tuple[Format, ...] = ("text", "json", "github")


@dataclass(frozen=True)
class Report:
    """The outcome of one check, ready to render."""

    findings: Sequence[Finding]
    level: Level
    against: str
    """How the reference was named (``--against``)."""
    path_prefix: str = ""
    """Prepended to descriptor file names to form paths, e.g. ``"protos/"``."""

    def path(self, finding: Finding) -> str:
        return f"{self.path_prefix}{finding.file}"

    @property
    def breaking(self) -> bool:
        return bool(self.findings)

    def summary_line(self) -> str:
        n = len(self.findings)
        if not n:
            return f"compatible: no breaking changes at level {self.level} against {self.against}"
        noun = "change" if n == 1 else "changes"
        return f"{n} breaking {noun} at level {self.level} against {self.against}"


def _repo_root(directory: Path) -> Path | None:
    try:
        result = subprocess.run(
            ["git", "rev-parse", "--show-toplevel"],
            cwd=directory,
            capture_output=True,
            text=True,
            check=False,
        )
    except OSError:
        return None
    return Path(result.stdout.strip()).resolve() if result.returncode == 0 else None


def path_prefix(schema_dir: Path | None, *, repository_relative: bool) -> str:
    """The prefix turning descriptor file names into paths a reader can open: the schema
    directory relative to the git repository root (``repository_relative``, what GitHub
    annotations need) or to the working directory; ``""`` without a schema directory."""
    if schema_dir is None:
        return ""
    schema_dir = schema_dir.resolve()
    base = _repo_root(schema_dir) if repository_relative else None
    base = base or Path.cwd().resolve()
    try:
        relative = schema_dir.relative_to(base).as_posix()
    except ValueError:
        relative = Path(os.path.relpath(schema_dir, base)).as_posix()
    return "" if relative == "." else f"{relative}/"


def render(report: Report, fmt: Format) -> str:
    """The report in ``fmt``, ending with a newline."""
    if fmt == "json":
        return render_json(report)
    if fmt == "github":
        return render_github(report)
    return render_text(report)


def _where(report: Report, f: Finding) -> str:
    if f.line is None:
        return report.path(f)
    column = f":{f.column}" if f.column is not None else ""
    return f"{report.path(f)}:{f.line}{column}"


def render_text(report: Report) -> str:
    lines = [f"{_where(report, f)}: {f.rule}: {f.message}" for f in report.findings]
    lines.append(report.summary_line())
    return "\n".join(lines) + "\n"


def render_json(report: Report) -> str:
    document = {
        "findings": [
            {
                "rule": f.rule,
                "file": f.file,
                "path": report.path(f),
                "line": f.line,
                "column": f.column,
                "message": f.message,
            }
            for f in report.findings
        ],
        "summary": {
            "breaking": report.breaking,
            "count": len(report.findings),
            "level": report.level,
            "against": report.against,
            "rules": dict(sorted(Counter(f.rule for f in report.findings).items())),
        },
    }
    return json.dumps(document, indent=2) + "\n"


def _escape_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(text: str) -> str:
    return _escape_data(text).replace(":", "%3A").replace(",", "%2C")


def render_github(report: Report) -> str:
    lines = []
    for f in report.findings:
        props = [f"file={_escape_property(report.path(f))}"]
        if f.line is not None:
            props.append(f"line={f.line}")
            if f.column is not None:
                props.append(f"col={f.column}")
        props.append(f"title={_escape_property(f.rule)}")
        lines.append(f"::error {','.join(props)}::{_escape_data(f.message)}")
    lines.append(report.summary_line())
    return "\n".join(lines) + "\n"
