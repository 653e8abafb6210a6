"""The crate's module structure: no import circles between the sibling modules of
``rust/src/processors``, ``rust/src/image`` and ``rust/src/tensor``
(``scripts/check_module_cycles.py``), and the checker does find a circle when there is one."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "check_module_cycles.py"
DIRS = [ROOT / "rust" / "src" / d for d in ("processors", "image", "tensor")]


def _checker() -> ModuleType:
    spec = importlib.util.spec_from_file_location("check_module_cycles", SCRIPT)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _crate(tmp_path: Path, files: dict[str, str]) -> Path:
    """A crate under ``tmp_path/src`` whose ``pkg`` module holds ``files``."""
    src = tmp_path / "src"
    pkg = src / "pkg"
    pkg.mkdir(parents=True)
    (src / "lib.rs").write_text("pub mod pkg;\n")
    for name, text in files.items():
        (pkg / name).write_text(text)
    return pkg


@pytest.mark.skipif(not DIRS[0].is_dir(), reason="needs the Rust sources")
def test_no_import_circles_in_the_crate() -> None:
    run = subprocess.run(
        [sys.executable, str(SCRIPT), *map(str, DIRS)], capture_output=True, text=True, check=False
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "no import circles" in run.stdout


@pytest.mark.skipif(not DIRS[0].is_dir(), reason="needs the Rust sources")
def test_families_never_import_the_registry() -> None:
    graph = _checker().build_graph(DIRS[0])
    # The registry names every family; the families name the value helpers and the trait.
    assert {"qwen", "clip", "llama4", "phi3v"} <= graph["config"]
    importers = sorted(name for name, targets in graph.items() if "config" in targets)
    assert importers == []
    assert "family" in graph["qwen"]
    assert "value" in graph["qwen"]
    assert graph["value"] <= {"error", "normalize", "sizes"}


def test_a_synthetic_circle_is_found(tmp_path: Path) -> None:
    pkg = _crate(
        tmp_path,
        {
            "mod.rs": "pub mod a;\npub mod b;\npub mod c;\npub use c::Thing;\n",
            # a -> b by a grouped `use`, b -> c through the parent's re-export, c -> a by a
            # path in code: a circle of three.
            "a.rs": "use super::{b::{self, B}, Other};\npub struct A;\n",
            "b.rs": "use super::Thing;\npub struct B;\n",
            "c.rs": "pub struct Thing;\nfn f() { let _ = crate::pkg::a::A; }\n",
        },
    )
    checker = _checker()
    assert checker.build_graph(pkg) == {"a": {"b"}, "b": {"c"}, "c": {"a"}}
    assert checker.cycles(checker.build_graph(pkg)) == [["a", "b", "c", "a"]]
    run = subprocess.run(
        [sys.executable, str(SCRIPT), str(pkg)], capture_output=True, text=True, check=False
    )
    assert run.returncode == 1
    assert "import circle" in run.stdout
    assert "a -> b -> c -> a" in run.stdout


def test_comments_strings_and_tests_draw_no_arrow(tmp_path: Path) -> None:
    pkg = _crate(
        tmp_path,
        {
            "mod.rs": "pub mod a;\npub mod b;\n",
            "a.rs": "use super::b::B;\n",
            "b.rs": (
                "// use super::a::A;\n"
                "/* super::a::A */\n"
                'const S: &str = "super::a::A";\n'
                "pub struct B;\n"
                "#[cfg(test)]\nmod tests {\n    use crate::pkg::a;\n}\n"
            ),
        },
    )
    checker = _checker()
    assert checker.build_graph(pkg) == {"a": {"b"}, "b": set()}
    assert checker.cycles(checker.build_graph(pkg)) == []
    # Counted when asked for: the test module's `use` then closes a circle.
    with_tests = checker.build_graph(pkg, include_tests=True)
    assert with_tests == {"a": {"b"}, "b": {"a"}}
    assert checker.cycles(with_tests) == [["a", "b", "a"]]


def test_super_inside_a_nested_module(tmp_path: Path) -> None:
    pkg = _crate(
        tmp_path,
        {
            "mod.rs": "pub mod a;\npub mod b;\n",
            # Inside `mod inner`, `super` is `a` itself and `super::super` the package.
            "a.rs": "mod inner {\n    use super::Local;\n    use super::super::b::B;\n}\n",
            "b.rs": "mod x86 {\n    fn f() { super::helper(); }\n}\nfn helper() {}\n",
        },
    )
    assert _checker().build_graph(pkg) == {"a": {"b"}, "b": set()}
