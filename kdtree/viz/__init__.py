"""Pure ``make_*_fig`` figure builders (plotly), one module per area: ``trace``, ``kernels``,
``tree``, ``decode``, ``profile``. Builders take data and return a figure; they never show it."""
