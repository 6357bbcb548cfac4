"""The ``kdtree`` command line (Typer). ``main.py`` assembles the sub-apps."""
