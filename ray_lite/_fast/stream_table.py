"""The owner's table of reported items of one streaming generator
(compiled twin ``_stream_table_c``, fallback ``_stream_table_py``).

The producer of a stream reports item ``i`` (``report``) when it is yielded;
the owner reads reports off its rings and records them here.  Taking the next
item (``try_next``) is then a look-up: it never blocks and never sends a
message.  This is what makes ``next(generator)`` on an already-reported item
cost nanoseconds instead of a ``ray.wait``.

``StreamTable()``
    ``report(index, payload)``        item ``index`` (0-based) is ``payload``;
                                      out-of-order reports are fine.
    ``report_end(count)``             the stream has exactly ``count`` items.
    ``report_error(index, error)``    item ``index`` raises ``error`` when taken;
                                      the stream ends after it.
    ``try_next()``                    the next item's payload (and advance), or
                                      ``NOT_READY``; raises ``StopIteration`` at
                                      the end, the stored error at its index.
    ``is_next_ready()``               ``try_next`` would not return ``NOT_READY``.
    ``is_finished()``                 the end is known and every item was taken.
    ``num_reported``, ``num_consumed``  counters for back-pressure.
    ``num_unconsumed``                reported but not yet taken.
    ``end_index``                     the item count if known, else -1.

Errors: a duplicate index, a negative index, an index at or after a known
end, or an end before an already reported index raise ``ValueError``.
"""
from ._select import load_twin

_impl, COMPILED = load_twin("stream_table")

StreamTable = _impl.StreamTable
NOT_READY = _impl.NOT_READY

__all__ = ["COMPILED", "StreamTable", "NOT_READY"]
