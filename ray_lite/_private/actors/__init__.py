"""Actors: their calls in their own process, their restarts, their ends.

Owns: ``async_actor`` (``AsyncActor``, the part of an async actor's
worker that runs its calls on its event loop), ``concurrency_groups``
(calls on a group's own loop or threads), ``held_calls`` (``HeldCalls``,
the part that holds a sync actor's calls waiting for a ref argument),
``method_lookup``, ``aio``, ``actor_exit`` (``exit_actor``, out of
scope), ``lease`` (what keeps an actor in scope), ``actor_owners``,
``restarts`` (``max_restarts``, ``max_task_retries``).

May import: ``scheduling``, ``job``, ``objects``, ``links``, ``process``,
``ray_lite._fast``, the base modules.
"""
