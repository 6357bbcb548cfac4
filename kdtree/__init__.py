"""kdtree."""
