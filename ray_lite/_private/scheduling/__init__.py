"""Resources and the driver's scheduling of pool tasks.

Owns: ``scheduler`` (demands, and ``Resources``: the driver's ledger of
custom resources, placement demands and what actors hold, ``driver.resources``),
``labels``, ``cluster`` (the machine as a cluster of one node),
``placement`` (placement groups, ``driver.placement``), ``task_dispatch``
(``TaskDispatch``: the driver's pool tasks, ``driver.dispatch``),
``task_cancel`` and ``task_retries`` (``driver.retries``).  Each part holds
the driver (``part.driver``); the counters and queues read on every task
are the driver's pool book's (``driver.book``, in ``ray_lite._fast``).

May import: ``job``, ``objects``, ``links``, ``process``, ``ray_lite._fast``,
the base modules.
"""
