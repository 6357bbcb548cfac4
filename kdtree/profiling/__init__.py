"""The parts of the phase profiler; import the API from ``kdtree.profiler``.

``core`` (hot path, CUDA events, log lines; standard library only), ``report`` (DataFrames),
``chrome`` (Chrome/Perfetto trace), ``store`` (Parquet/CSV files), ``logparse`` (``parse_log``).
Importing this package loads nothing but its own name; pandas comes in on first use.
"""
