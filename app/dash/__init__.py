"""``forge dash``: a local, read-only web app on a run directory: live curves, the services' health and a
trajectory browser over the run's pools."""
