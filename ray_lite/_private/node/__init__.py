"""The node each process holds, made of parts, and the processes themselves.

Owns: ``node`` (``Node``: what every process has, composed of its parts),
``driver`` (``DriverNode``: the pool, the scheduler, actors, names),
``worker`` (``WorkerNode``: pool workers and actor processes, the task
runner and the parts a worker holds), ``worker_streams`` (``Generators``:
the streams a worker produces), ``zygote`` (forks workers),
``pool_worker`` (``max_calls``), ``introspect`` (the driver's answers about
the runtime's state).

May import: ``actors``, ``scheduling``, ``job``, ``objects``, ``links``,
``process``, ``ray_lite._fast``, the base modules.
"""
