"""``ray_lite.MessageQueue``: the shared-memory broadcast queue (one writer,
N readers), usable on its own.  Everything is documented in
:mod:`ray_lite._fast.broadcast`; this module only gives it its public name.

    from ray_lite import MessageQueue
    q = MessageQueue(n_readers=2)                    # the writer
    handle = q.export_handle()                       # send it to the readers
    r = MessageQueue.attach(handle, reader_rank=0)   # in a reader process
    q.enqueue({"step": 1}); r.dequeue(timeout=5)
"""
from ray_lite._fast.broadcast import MessageQueue
from ray_lite._fast.errors import ChannelClosedError, PeerDiedError

__all__ = ["MessageQueue", "ChannelClosedError", "PeerDiedError"]
