"""``python -m kdtree`` is the ``kdtree`` command."""

from kdtree.cli.main import app

app(prog_name="kdtree")
