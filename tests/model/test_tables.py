"""The model shares its tables with enforcement, and its docstring follows the README's layer
table (the project's own copy of DESIGN §2's)."""

from __future__ import annotations

import re
from pathlib import Path

import stockade.model
from stockade.policy import LAYERS


def test_docstring_table_lists_every_layer_in_order() -> None:
    doc = stockade.model.__doc__ or ""
    rows = [m.group(1) for m in re.finditer(r"^(\w+)\s{2,}\S", doc, re.MULTILINE)]
    assert [r for r in rows if r in LAYERS] == list(LAYERS)


#: The project's own description of the layers (DESIGN §2's table, as the README keeps it).
README = Path(__file__).resolve().parents[2] / "README.md"


def test_docstring_table_in_sync_with_the_readme() -> None:
    table = [
        line.split("|")[1].strip().strip("`")
        for line in README.read_text(encoding="utf-8").splitlines()
        if line.startswith("| `")
    ]
    assert table == list(LAYERS)
    doc = stockade.model.__doc__ or ""
    for layer in table:
        assert re.search(rf"^{layer}\s", doc, re.MULTILINE), layer


def test_model_imports_only_policy() -> None:
    src = Path(stockade.model.__file__).parent
    for file in src.glob("*.py"):
        for line in file.read_text().splitlines():
            m = re.match(r"\s*(?:from|import) (stockade\.\w+)", line)
            if m:
                assert m.group(1) in ("stockade.model", "stockade.policy"), (file.name, line)
