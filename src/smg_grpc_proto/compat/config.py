"""Per-rule ignores, read from TOML the way buf reads them from ``buf.yaml``.

Either a file passed with ``--config`` or the ``[tool.smg-proto.compat]`` table of the
``pyproject.toml`` next to the ``protos/`` directory::

    [tool.smg-proto.compat]
    ignore = ["legacy/old.proto"]                      # every rule, these files or directories
    except = ["FIELD_SAME_JSON_NAME"]                  # rules switched off entirely
    [tool.smg-proto.compat.ignore_only]
    FIELD_SAME_ONEOF = ["vllm_engine.proto"]           # one rule (or buf category), these paths

A ``--config`` file may hold the same keys at its top level or in that table. Paths are
descriptor file names (relative to the schema root) or directory prefixes.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from smg_grpc_proto.compat._model import BUF_CATEGORY, CompatError, Finding
from smg_grpc_proto.compat.rules import RULES

TABLE = ("tool", "smg-proto", "compat")
KEYS = ("ignore", "ignore_only", "except")
ALL_RULES = "*"
EVERYWHERE = "."
_CATEGORIES = {category: level for level, category in BUF_CATEGORY.items()}


@dataclass(frozen=True)
class CompatConfig:
    """The ignores of one configuration source."""

    ignore: tuple[str, ...] = ()
    """Paths no rule reports on."""
    ignore_only: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """Rule id (or buf category id) → paths that rule does not report on."""
    except_rules: tuple[str, ...] = ()
    """Rules that never run."""
    source: str | None = None
    """Where the configuration was read from (for messages)."""

    def as_ignore(self) -> dict[str, list[str]]:
        """The ``ignore`` mapping :func:`smg_grpc_proto.compat.check` takes."""
        out: dict[str, list[str]] = {key: list(paths) for key, paths in self.ignore_only.items()}
        if self.ignore:
            out.setdefault(ALL_RULES, []).extend(self.ignore)
        for rule_id in self.except_rules:
            out.setdefault(rule_id, []).append(EVERYWHERE)
        return out


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        if sys.version_info >= (3, 11):
            import tomllib
        else:  # pragma: no cover - exercised on Python 3.10 only
            try:
                import tomli as tomllib  # type: ignore[import-not-found,unused-ignore]
            except ImportError as exc:
                raise CompatError(
                    f"{path}: reading TOML needs Python 3.11+ or the tomli package "
                    "(pip install tomli)"
                ) from exc
        with path.open("rb") as fh:
            data: dict[str, Any] = tomllib.load(fh)
            return data
    except OSError as exc:
        raise CompatError(f"cannot read config file {path}: {exc.strerror or exc}") from exc
    except ValueError as exc:  # tomllib.TOMLDecodeError is a ValueError
        raise CompatError(f"{path}: invalid TOML: {exc}") from exc


def _table(data: Mapping[str, Any]) -> Mapping[str, Any] | None:
    node: Any = data
    for key in TABLE:
        if not isinstance(node, Mapping) or key not in node:
            return None
        node = node[key]
    if not isinstance(node, Mapping):
        raise CompatError(f"[{'.'.join(TABLE)}] must be a table")
    return node


def _strings(value: Any, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise CompatError(f"{where} must be a list of strings, got {value!r}")
    return tuple(value)


def _known_key(key: str, where: str) -> None:
    if key not in RULES and key not in _CATEGORIES:
        raise CompatError(
            f"{where}: unknown rule id {key!r} (rule ids are buf's, e.g. FIELD_SAME_TYPE; "
            f"categories: {', '.join(_CATEGORIES)})"
        )


def parse_config(values: Mapping[str, Any], source: str) -> CompatConfig:
    """Validate the ``ignore`` / ``ignore_only`` / ``except`` keys of a config table."""
    unknown = sorted(set(values) - set(KEYS))
    if unknown:
        raise CompatError(
            f"{source}: unknown key(s) {', '.join(unknown)}; expected {', '.join(KEYS)}"
        )
    ignore = _strings(values.get("ignore", []), f"{source}: ignore")
    raw_only = values.get("ignore_only", {})
    if not isinstance(raw_only, Mapping):
        raise CompatError(f"{source}: ignore_only must be a table of rule id = [paths]")
    ignore_only = {}
    for key, paths in raw_only.items():
        _known_key(key, f"{source}: ignore_only")
        ignore_only[key] = _strings(paths, f"{source}: ignore_only.{key}")
    except_rules = _strings(values.get("except", []), f"{source}: except")
    for key in except_rules:
        _known_key(key, f"{source}: except")
    return CompatConfig(ignore, ignore_only, except_rules, source)


def load_config(path: Path) -> CompatConfig:
    """A ``--config`` file: its ``[tool.smg-proto.compat]`` table, else its top-level keys."""
    data = _read_toml(path)
    table = _table(data)
    return parse_config(table if table is not None else data, str(path))


def find_config(protos_dir: Path) -> CompatConfig | None:
    """The ``[tool.smg-proto.compat]`` table of ``pyproject.toml`` next to ``protos_dir``."""
    pyproject = protos_dir.resolve().parent / "pyproject.toml"
    if not pyproject.is_file():
        return None
    if sys.version_info < (3, 11) and "smg-proto" not in pyproject.read_text(errors="replace"):
        return None  # nothing to read: do not require tomli on Python 3.10
    table = _table(_read_toml(pyproject))
    if table is None:
        return None
    return parse_config(table, f"{pyproject} [{'.'.join(TABLE)}]")


def validate_ignore(ignore: Mapping[str, Sequence[str]]) -> None:
    """Reject unknown rule ids in an ``ignore`` mapping (``"*"`` and categories are fine)."""
    for key, paths in ignore.items():
        if key != ALL_RULES:
            _known_key(key, "ignore")
        if isinstance(paths, str):
            raise CompatError(f"ignore[{key!r}] must be a list of paths, not a string")


def _normalize(path: str) -> str:
    path = path.replace("\\", "/").strip()
    while path.startswith("./"):
        path = path[2:]
    return path.rstrip("/") or EVERYWHERE


def path_matches(file: str, pattern: str) -> bool:
    """``pattern`` is ``"."`` (everything), a file name, or a directory prefix of ``file``."""
    pattern = _normalize(pattern)
    return pattern == EVERYWHERE or file == pattern or file.startswith(pattern + "/")


def is_ignored(finding: Finding, ignore: Mapping[str, Sequence[str]]) -> bool:
    """Whether an ``ignore`` mapping drops ``finding``."""
    keys = [ALL_RULES, finding.rule]
    keys += [cat for cat, level in _CATEGORIES.items() if level in RULES[finding.rule].categories]
    return any(path_matches(finding.file, p) for key in keys for p in ignore.get(key, ()))
