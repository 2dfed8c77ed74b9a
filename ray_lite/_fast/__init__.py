"""Hot paths of ray_lite, each written twice.

Every module ``x`` here exists as a compiled twin ``_x_c.pyx`` and a
pure-Python twin ``_x_py.py`` with the same names, signatures and errors;
``x.py`` picks one at import time.  ``RAY_LITE_NO_EXTENSIONS=1`` forces the
pure-Python twins (and, at build time, skips compiling them).

The pure-Python twins are the executable specification: when the two
disagree, the compiled one is wrong.
"""
#: True when the environment asks for the pure-Python twins.
from .._config import NO_EXTENSIONS

# (after NO_EXTENSIONS, which they need)
from . import (broadcast, codec, http_conn, link, pool_book, ring,  # noqa: E402
               stream_table, task_runner)

#: The hot paths (each a module ``x`` with twins ``_x_c`` and ``_x_py``).
HOT_PATHS = ("broadcast", "codec", "http_conn", "link", "pool_book", "ring", "stream_table",
             "task_runner")

#: True when every hot path runs its compiled twin.
USING_EXTENSIONS = all(m.COMPILED for m in (broadcast, codec, http_conn, link, pool_book, ring,
                                              stream_table, task_runner))

__all__ = ["HOT_PATHS", "NO_EXTENSIONS", "USING_EXTENSIONS", "broadcast", "codec", "http_conn",
           "link", "pool_book", "ring", "stream_table", "task_runner"]
