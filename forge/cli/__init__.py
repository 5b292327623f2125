"""Click commands derived from settings (``options``), overrides of a command's settings given from outside its
command line (``overrides``), and what every Forge command shares: logging, entry points, ready files (``common``)."""
