"""The ``kdtree.spec`` package surface."""

import subprocess
import sys


def test_package_exports_are_not_shadowed_by_submodules():
    """``from kdtree.spec import generate`` is the function even after every submodule of the
    package was imported (a submodule named like an export would shadow it)."""
    code = (
        "import importlib, pkgutil, kdtree.spec as s\n"
        "for m in pkgutil.iter_modules(s.__path__):\n"
        "    importlib.import_module('kdtree.spec.' + m.name)\n"
        "from kdtree.spec import generate, SpecEngine\n"
        "assert callable(generate) and generate.__name__ == 'generate', generate\n"
        "assert isinstance(SpecEngine, type)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
