"""Objects: refs, their values, the shared-memory store, streams.

Owns: ``refs`` (``ObjectRef``, ``ObjectRefGenerator``), ``entries`` and
``stored`` (the value slots behind refs), ``object_store`` (large objects in
shared memory), ``spill`` (where they go past its capacity), ``ownership`` (results, refs lent and borrowed, fetching
values: the node's objects part), ``streams`` (streams a process owns),
``returns`` (``num_returns=N``), ``dynamic_generator``, ``shipping``
(functions and classes sent by value).

May import: ``links``, ``process``, ``ray_lite._fast``, the base modules.
"""
