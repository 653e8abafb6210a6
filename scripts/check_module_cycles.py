"""Report import circles between the sibling modules of Rust module directories.

For each directory given (default: ``rust/src/processors``, ``rust/src/image`` and
``rust/src/tensor``), every ``*.rs`` file directly inside it except ``mod.rs`` is one module, a
sibling of the others. An arrow ``a -> b`` is drawn when ``a.rs`` names sibling ``b`` by path:

* in a ``use`` declaration (``use super::b::X;``, ``use super::{b::X, c};``,
  ``use crate::<dir>::b::X;``, ``pub use ...``), expanded brace by brace;
* in a path written in code (``super::b::f()``, ``crate::<dir>::b::T``, ``super::super::b``
  from a module nested in the file).

A name the parent ``mod.rs`` re-exports from a sibling (``pub use b::X;`` in ``mod.rs``, then
``use super::X;`` in ``a.rs``) counts as naming ``b``: going through the parent does not hide
an arrow. Comments and string literals are ignored. ``#[cfg(test)]`` modules are skipped unless
``--include-tests`` is given. The directories must be modules of a crate whose root is
``rust/src`` (paths are resolved against the directory's place under ``src``).

Prints every circle (a strongly connected component of more than one module, or a module naming
itself) with one cycle through it, and exits 1 when there is any, else 0.

Usage: ``python scripts/check_module_cycles.py [--include-tests] [DIR ...]``.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

DEFAULT_DIRS = ("rust/src/processors", "rust/src/image", "rust/src/tensor")

_IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
_PATH_IN_CODE = re.compile(rf"\b(?:crate|super|self)(?:\s*::\s*{_IDENT})+")


def strip_comments_and_strings(text: str) -> str:
    """``text`` with comments, string and char literals blanked (newlines kept)."""
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        nxt = text[i + 1] if i + 1 < n else ""
        if c == "/" and nxt == "/":
            j = text.find("\n", i)
            i = n if j < 0 else j
            continue
        if c == "/" and nxt == "*":
            depth, i = 1, i + 2
            while i < n and depth:
                if text.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif text.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    if text[i] == "\n":
                        out.append("\n")
                    i += 1
            continue
        raw = (
            re.match(r'r(#*)"', text[i:])
            if c == "r" and (i == 0 or not _word(text[i - 1]))
            else None
        )
        if raw:
            end = text.find('"' + raw.group(1), i + len(raw.group(0)))
            end = n if end < 0 else end + 1 + len(raw.group(1))
            out.append('""' + "\n" * text.count("\n", i, end))
            i = end
            continue
        if c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append('""' + "\n" * text.count("\n", i, j))
            i = j + 1
            continue
        if c == "'":
            # A char literal ('a', '\n', '\u{..}'), not a lifetime ('a).
            m = re.match(r"'(?:\\(?:u\{[0-9A-Fa-f]+\}|x[0-9A-Fa-f]{2}|.)|[^\\'])'", text[i:])
            if m:
                out.append("' '")
                i += len(m.group(0))
                continue
        out.append(c)
        i += 1
    return "".join(out)


def _word(c: str) -> bool:
    return c.isalnum() or c == "_"


def drop_test_modules(text: str) -> str:
    """``text`` without the ``#[cfg(test)]`` items (a ``mod``, ``fn`` or ``use``), newlines kept."""
    out = []
    pos = 0
    for m in re.finditer(r"#\s*\[\s*cfg\s*\(\s*test\s*\)\s*\]", text):
        if m.start() < pos:
            continue
        j = m.end()
        # The item ends at its first top-level ';' or at the '}' closing its first '{'.
        depth = 0
        while j < len(text):
            if text[j] == "{":
                depth += 1
            elif text[j] == "}":
                depth -= 1
                if depth == 0:
                    j += 1
                    break
            elif text[j] == ";" and depth == 0:
                j += 1
                break
            j += 1
        out.append(text[pos : m.start()])
        out.append("\n" * text.count("\n", m.start(), j))
        pos = j
    out.append(text[pos:])
    return "".join(out)


def expand_use_tree(tree: str) -> list[list[str]]:
    """``a::{b, c::{d, e as f}, self}`` as ``[[a, b], [a, c, d], [a, c, e], [a]]``."""
    tree = re.sub(r"\s+", "", tree)

    def parse(s: str, prefix: list[str]) -> list[list[str]]:
        if not s:
            return []
        brace = s.find("{")
        if brace < 0:
            s = s.split("as", 1)[0] if re.search(r"(?<=[A-Za-z0-9_])as(?=[A-Za-z_])", s) else s
            parts = [p for p in s.split("::") if p]
            if parts and parts[-1] == "self":
                parts = parts[:-1]
            if parts and parts[-1] == "*":
                parts = parts[:-1]
            return [prefix + parts]
        head = [p for p in s[:brace].split("::") if p]
        body = s[brace + 1 : s.rfind("}")]
        items, depth, start = [], 0, 0
        for k, ch in enumerate(body):
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
            elif ch == "," and depth == 0:
                items.append(body[start:k])
                start = k + 1
        items.append(body[start:])
        result: list[list[str]] = []
        for item in items:
            result.extend(parse(item, prefix + head))
        return result

    return parse(tree, [])


def _as_ident_list(path: str) -> list[str]:
    return [p for p in re.split(r"\s*::\s*", path.strip()) if p]


def _nested_module_at(text: str, offset: int) -> list[str]:
    """The inline modules (``mod x { ... }``) enclosing ``offset``, outermost first."""
    stack: list[tuple[str | None, int]] = []  # (module name or None for other braces, depth)
    for m in re.finditer(rf"\bmod\s+({_IDENT})\s*\{{|[{{}}]", text[:offset]):
        if m.group(1):
            stack.append((m.group(1), m.start()))
        elif m.group(0) == "{":
            stack.append((None, m.start()))
        else:
            if stack:
                stack.pop()
    return [name for name, _ in stack if name]


def module_paths(text: str, here: list[str]) -> list[list[str]]:
    """Every absolute module path (crate-relative) named in ``text`` of the module ``here``."""
    found: list[tuple[int, list[str]]] = []
    for m in re.finditer(r"\buse\s+([^;]+);", text):
        for parts in expand_use_tree(m.group(1)):
            found.append((m.start(), parts))
    use_spans = [(m.start(), m.end()) for m in re.finditer(r"\buse\s+[^;]+;", text)]
    for m in _PATH_IN_CODE.finditer(text):
        if any(a <= m.start() < b for a, b in use_spans):
            continue
        found.append((m.start(), _as_ident_list(m.group(0))))
    result = []
    for offset, parts in found:
        where = here + _nested_module_at(text, offset)
        resolved = resolve(parts, where)
        if resolved is not None:
            result.append(resolved)
    return result


def resolve(parts: list[str], where: list[str]) -> list[str] | None:
    """``parts`` (``crate``/``super``/``self``-relative) as a crate-relative path, else None."""
    if not parts:
        return None
    if parts[0] == "crate":
        return parts[1:]
    if parts[0] not in ("super", "self"):
        return None  # an external crate, std, or a name in scope
    base = list(where)
    k = 0
    while k < len(parts) and parts[k] in ("super", "self"):
        if parts[k] == "super":
            if not base:
                return None
            base.pop()
        k += 1
    return base + parts[k:]


def build_graph(directory: Path, include_tests: bool = False) -> dict[str, set[str]]:
    """Arrows between the sibling modules of ``directory`` (``name -> names it uses``)."""
    src = _crate_root(directory)
    package = list(directory.resolve().relative_to(src.resolve()).parts)
    siblings = sorted(p.stem for p in directory.glob("*.rs") if p.name not in ("mod.rs", "lib.rs"))
    sibling_dirs = {p.name for p in directory.iterdir() if p.is_dir() and (p / "mod.rs").is_file()}
    modules = set(siblings) | sibling_dirs

    def prepare(path: Path) -> str:
        text = strip_comments_and_strings(path.read_text(encoding="utf-8"))
        return text if include_tests else drop_test_modules(text)

    # Names the parent re-exports from a sibling: `pub use b::{X, Y};` in mod.rs.
    reexports: dict[str, str] = {}
    parent = directory / "mod.rs"
    if parent.is_file():
        text = prepare(parent)
        for m in re.finditer(r"\bpub(?:\s*\([^)]*\))?\s+use\s+([^;]+);", text):
            for parts in expand_use_tree(m.group(1)):
                if parts[:1] == ["self"]:
                    parts = parts[1:]
                if len(parts) >= 2 and parts[0] in modules:
                    reexports[parts[-1]] = parts[0]

    graph: dict[str, set[str]] = {name: set() for name in siblings}
    for name in siblings:
        text = prepare(directory / f"{name}.rs")
        for path in module_paths(text, [*package, name]):
            if path[: len(package)] != package or len(path) <= len(package):
                continue
            target = path[len(package)]
            if target in modules:
                if target != name:
                    graph[name].add(target)
            elif target in reexports and reexports[target] != name:
                graph[name].add(reexports[target])
    return graph


def _crate_root(directory: Path) -> Path:
    for candidate in [directory, *directory.resolve().parents]:
        if candidate.name == "src" and (candidate / "lib.rs").is_file():
            return candidate
    raise SystemExit(f"{directory}: not inside a crate's src directory (no lib.rs above it)")


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with a cycle (Tarjan), each as one cycle through it."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in graph:
                continue
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in graph.get(v, ()):
                components.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return [_one_cycle(graph, c) for c in sorted(components)]


def _one_cycle(graph: dict[str, set[str]], component: list[str]) -> list[str]:
    """A shortest cycle through the component's first module (a breadth-first search)."""
    members = set(component)
    start = component[0]
    previous: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for v in frontier:
            for w in sorted(graph[v] & members):
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(previous[path[-1]])
                    return [*reversed(path), start]
                if w not in previous:
                    previous[w] = v
                    following.append(w)
        frontier = following
    return [start, start]


def check(directories: Iterable[Path], include_tests: bool = False) -> list[str]:
    """One line per circle found, ``dir: a -> b -> a (component: a, b)``."""
    problems = []
    for directory in directories:
        graph = build_graph(directory, include_tests)
        for cycle in cycles(graph):
            problems.append(f"{directory}: {' -> '.join(cycle)}")
    return problems


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dirs", nargs="*", type=Path, help="module directories")
    parser.add_argument("--include-tests", action="store_true", help="count #[cfg(test)] items")
    parser.add_argument("--graph", action="store_true", help="print every arrow too")
    args = parser.parse_args(argv)
    root = Path(__file__).resolve().parent.parent
    dirs = args.dirs or [root / d for d in DEFAULT_DIRS]
    for d in dirs:
        if not d.is_dir():
            print(f"{d}: not a directory", file=sys.stderr)
            return 2
    if args.graph:
        for d in dirs:
            for name, targets in sorted(build_graph(d, args.include_tests).items()):
                print(f"{d}: {name} -> {', '.join(sorted(targets)) or '(nothing)'}")
    problems = check(dirs, args.include_tests)
    for line in problems:
        print(f"import circle in {line}")
    if not problems:
        print(f"no import circles in {', '.join(str(d) for d in dirs)}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
