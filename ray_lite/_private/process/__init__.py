"""What every process of the runtime is, before and beside its node.

Owns: ``state`` (this process's node, started on first use), ``backend`` (which
engine runs the program, and the hooks the Ray engine registers), ``ids``,
``errors`` (what crosses a process boundary when user code fails),
``procutil`` and ``boot`` (starting processes, dying with the parent),
``interrupts`` (Ctrl-C without corrupting the runtime).

May import: ``ray_lite._fast`` and the base modules (``_version``, ``_config``,
``_lazy``, ``exceptions``).
"""
