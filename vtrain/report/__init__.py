"""Reports: ``report.md``, a self-contained ``report.html`` (plotly) and ``metrics.json`` per trace folder, a
summary per validation suite, and the short tables printed on the terminal. Folders are written atomically."""
