"""``forge top`` and ``forge plot``: live telemetry of a running system in the terminal (every service's Stats,
GPUs through NVML) and plots of a run's metrics. Modules: discovery (which services), poller (their Stats),
snapshot (plain data, JSON), view (the rich frame), fmt (number forms), plot (PNG curves), cli (the commands)."""
