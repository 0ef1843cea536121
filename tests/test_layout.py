"""The package's layers, checked from the source: imports point one way."""
import ast
from pathlib import Path

from pipeline.paths import REPO_ROOT

PACKAGE = REPO_ROOT / "pipeline"
# imports point one way: a layer imports only the layers below it (errors and paths: anyone)
LAYERS = ["gguf_io", "model", "run", "store", "flow", "tools"]


def imported_modules(path: Path) -> set[str]:
    """Absolute dotted names of what a module of the package imports, relative imports resolved."""
    here = path.relative_to(REPO_ROOT).with_suffix("").parts[:-1]  # the module's package
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = list(here[:len(here) - node.level + 1]) if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            names |= {module} | {f"{module}.{alias.name}" for alias in node.names}
    return names


def layer_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == "pipeline" and len(parts) > 1 and parts[1] in LAYERS else None


def test_layers_import_only_the_layers_below_them():
    wrong = []
    for layer in LAYERS:
        for path in (PACKAGE / layer).rglob("*.py"):
            for module in imported_modules(path):
                target = layer_of(module)
                if target is not None and LAYERS.index(target) > LAYERS.index(layer):
                    wrong.append(f"{path.relative_to(REPO_ROOT)} imports {module}")
    assert not wrong, "\n".join(wrong)


def test_luigi_and_zarr_stay_in_their_layers():
    for layer in ("gguf_io", "model", "run", "store"):
        for path in (PACKAGE / layer).rglob("*.py"):
            assert not any(m.split(".")[0] == "luigi" for m in imported_modules(path)), path
    for layer in ("gguf_io", "model", "run"):
        for path in (PACKAGE / layer).rglob("*.py"):
            assert not any(m.split(".")[0] == "zarr" for m in imported_modules(path)), path

