"""The entry point's own imports, made once per pod in the forkserver every restarted rank is forked from.

A module or script of the user's imports what it needs (transformers, its own helpers) at its top, and
a forked worker runs that top at every start: seconds per rank per restart for transformers' Llama on a
CPU core. The launcher reads the entry point's source (without running it) and writes its module-level
`import` and `from ... import` statements -- only those, each in a try -- into a small module the
forkserver imports with its other warm modules (launch.py `warm_modules`). That covers what a bare
module name in `entrypoint.preload` cannot: `from transformers import LlamaForCausalLM` loads the model's
code only when the name is taken, which `import transformers` does not do.

What is imported is exactly what the worker would import first, from the same places: a script's own
folder comes first on the path while its imports run, as `python SCRIPT` puts it first, so a helper
module beside the script is that one and never a namesake elsewhere. Imports inside functions or under
an `if` (`if TYPE_CHECKING:`, a GPU-only branch) are left to the worker, and so is the script's own code.
`entrypoint.preload_imports: false` turns it off (the env variable below is then "0").
"""

from __future__ import annotations

import ast
import hashlib
import tempfile
from pathlib import Path

PRELOAD_IMPORTS_ENV = "NVRX_EKS_PRELOAD_IMPORTS"
""""0": the entry point's imports are not made in the forkserver (`entrypoint.preload_imports: false`)."""
MODULE_PREFIX = "_nvrx_eks_entry_imports_"


def top_level_imports(source: str) -> list[ast.stmt]:
    """The module-level absolute imports of `source` (also in a top-level `try:` body), `__future__` aside."""

    def absolute(statement: ast.stmt) -> bool:
        if isinstance(statement, ast.ImportFrom):
            return not statement.level and statement.module != "__future__"
        return isinstance(statement, ast.Import)

    nodes = ast.parse(source).body
    return [s for node in nodes for s in (node.body if isinstance(node, ast.Try) else [node]) if absolute(s)]


def warm_module_source(source_path: Path, *, script_folder: Path | None) -> str | None:
    """A module that makes `source_path`'s top-level imports, each in a try; None when it has none."""
    try:
        statements = top_level_imports(source_path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return None  # the worker reports what it cannot read or compile
    if not statements:
        return None
    body = "".join(
        f"    try:\n        {ast.unparse(statement)}\n    except Exception:\n        pass\n"
        for statement in statements
    )
    folder = repr(str(script_folder)) if script_folder is not None else "None"
    return (
        f'"""The top-level imports of {source_path}, made once in the forkserver (written by\n'
        'nvrx_eks.training.resilience.warm_entry)."""\n'
        "import sys\n\n"
        f"_folder = {folder}\n"
        "if _folder is not None:\n"
        "    sys.path.insert(0, _folder)\n"
        "try:\n"
        f"{body}"
        "finally:\n"
        "    if _folder is not None:\n"
        "        sys.path.remove(_folder)\n"
    )


def write_warm_module(source_path: Path, *, script_folder: Path | None) -> tuple[Path, str] | None:
    """(folder, module name) of the written module, to put on the forkserver's path and preload; None
    when the entry point imports nothing at its top or no temporary folder can be written."""
    text = warm_module_source(source_path, script_folder=script_folder)
    if text is None:
        return None
    name = MODULE_PREFIX + hashlib.sha256(text.encode()).hexdigest()[:12]
    try:
        folder = Path(tempfile.mkdtemp(prefix="nvrx-eks-warm-"))
        (folder / f"{name}.py").write_text(text, encoding="utf-8")
    except OSError:
        return None
    return folder, name
