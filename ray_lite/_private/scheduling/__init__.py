"""Resources and the driver's scheduling of pool tasks.

Owns: ``scheduler`` (demands and the driver's ledger of free resources),
``labels``, ``cluster`` (the machine as a cluster of one node),
``placement`` (placement groups), ``task_dispatch``, ``task_cancel`` and
``task_retries`` (the driver's pool tasks).

May import: ``job``, ``objects``, ``links``, ``process``, ``ray_lite._fast``,
the base modules.
"""
