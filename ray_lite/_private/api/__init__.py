"""What the public API's functions and classes do.

Owns: ``core`` (``init``, ``shutdown``, ``get``, ``wait``, ``put``, ``kill``,
``cancel``, ``get_actor``, ``remote``), ``remote`` (remote functions and actor
classes), ``actor_handle``, ``call_options`` and ``signatures`` (a call's
options and arguments, checked), ``method_options``, ``runtime_context``,
``plugins`` (where ``ray_lite.dag`` registers itself).

May import: every other ``_private`` package, ``ray_lite._fast``, the base
modules.  The layers above plug in: the Ray engine through
``process.backend.register_engine``, ``ray_lite.dag`` through ``plugins``.
"""
