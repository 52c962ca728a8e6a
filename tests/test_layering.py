"""Imports flow one way along the pipeline of DESIGN.md; importing the package loads nothing heavy."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "learnedperf"

#: pipeline order: a module may import only stages at or before its own (plus the shared modules)
ORDER = ["catalog", "specs", "graph", "cost", "simulate", "measure", "data", "features", "models", "checkpoint",
         "predict", "service", "cli"]
SHARED = {"units", "errors", "io", "__init__"}


def _stage(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "learnedperf" or len(parts) < 2:
        return None
    if not ((PKG / parts[1]).is_dir() or (PKG / f"{parts[1]}.py").exists()):
        return None  # an attribute of the package root (e.g. __version__), not a module
    return parts[1]


def _module_name(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    return ".".join(rel.parts)


def _imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    mod = _module_name(path)
    package = mod.rsplit(".", 1)[0] if path.name != "__init__.py" else mod
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.extend(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
                if node.module is None:
                    out.extend(f"{target}.{a.name}" for a in node.names)
                else:
                    out.append(target)
            elif node.module:
                out.append(node.module)
    return out


def test_imports_flow_downstream():
    bad = []
    for path in PKG.rglob("*.py"):
        own = _stage(_module_name(path))
        if own is None or own in SHARED:
            continue
        assert own in ORDER, f"{path}: stage {own!r} is not in the pipeline order of this test"
        for imp in _imports(path):
            other = _stage(imp)
            if other is None or other in SHARED or other == own:
                continue
            if other not in ORDER or ORDER.index(other) > ORDER.index(own):
                bad.append(f"{path.relative_to(PKG.parent)} imports {imp} (upstream {own} -> {other})")
    assert not bad, "\n".join(bad)


def test_layering_check_detects_a_backward_import(tmp_path):
    # the walker itself must see relative imports, or the test above could never fail
    f = PKG / "graph" / "execution.py"
    assert any(_stage(i) == "specs" for i in _imports(f))


def test_import_is_fast_and_loads_nothing_heavy():
    code = ("import sys, time; t=time.perf_counter(); import learnedperf, learnedperf.cli; "
            "dt=time.perf_counter()-t; heavy=[m for m in ('torch','torch_geometric','lightgbm','pandas') "
            "if m in sys.modules]; print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
