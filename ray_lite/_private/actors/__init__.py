"""Actors: their calls in their own process, their restarts, their ends.

Owns: ``async_actor`` and ``concurrency_groups`` (calls on an event loop or
threads), ``held_calls``, ``method_lookup``, ``aio``, ``actor_exit``
(``exit_actor``, out of scope), ``lease`` (what keeps an actor in scope),
``actor_owners``, ``restarts`` (``max_restarts``, ``max_task_retries``).

May import: ``scheduling``, ``job``, ``objects``, ``links``, ``process``,
``ray_lite._fast``, the base modules.
"""
