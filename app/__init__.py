"""The entry points: what composes Forge's services into a system. ``forge up`` (``up``), ``forge deploy``
(``deploy``), the rollout drivers and ``forge rollout`` (``rollout``), ``forge top`` and ``forge plot`` (``top``),
``forge config show``, ``forge keys``, ``forge model`` and the pre-training of the built-in models, the ``forge``
command group (``main``); the service registry they all read (``registry``) and the typed builder of the services'
command lines (``command_line``). This floor imports the services; nothing imports it."""
