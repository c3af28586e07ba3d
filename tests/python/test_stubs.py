"""The package's type stubs (python/dpipe/__init__.pyi) are what scripts/python_stubs.py generates from the
node kinds' schemas, and name every public function the package has."""
import ast
import pathlib
import subprocess
import sys

import dpipe
from conftest import SOURCE_ROOT


def test_the_committed_stubs_are_the_generated_ones():
    generated = subprocess.run([sys.executable, str(SOURCE_ROOT / "scripts" / "python_stubs.py")],
                               capture_output=True, text=True, check=True).stdout
    committed = (SOURCE_ROOT / "python" / "dpipe" / "__init__.pyi").read_text()
    assert committed == generated, "regenerate: scripts/python_stubs.py > python/dpipe/__init__.pyi"
    assert (SOURCE_ROOT / "python" / "dpipe" / "py.typed").exists()


def test_the_stubs_name_every_public_name_of_the_package():
    tree = ast.parse((SOURCE_ROOT / "python" / "dpipe" / "__init__.pyi").read_text())
    stubbed = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    stubbed |= {t.id for n in tree.body if isinstance(n, ast.AnnAssign) for t in [n.target]}
    assert set(dpipe.__all__) <= stubbed, set(dpipe.__all__) - stubbed
    assert "Loader" in dir(dpipe)
