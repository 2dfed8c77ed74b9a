"""``ray_lite.MessageQueue``: the broadcast queue (one writer, N readers),
usable on its own.  Readers on the writer's machine read shared memory
(:mod:`ray_lite._fast.broadcast` documents it); readers on other machines
get the same messages over TCP (:mod:`ray_lite._private.links.mq_network`).

    from ray_lite import MessageQueue
    q = MessageQueue(n_readers=2)                    # the writer
    handle = q.export_handle()                       # send it to the readers
    r = MessageQueue.attach(handle, reader_rank=0)   # in a reader process
    q.enqueue({"step": 1}); r.dequeue(timeout=5)

vLLM's names work too (``vllm/distributed/device_communicators/shm_broadcast.py``)::

    q = MessageQueue(3, local_reader_ranks=[0, 1], connect_ip="10.0.0.5")  # rank 2 remote
    r = MessageQueue.create_from_handle(q.export_handle(), rank)
    q.wait_until_ready(); r.wait_until_ready()       # collective
    q.broadcast_object(x); r.broadcast_object()      # -> x
    r.dequeue(timeout=None, cancel=threading.Event())
    r.shutdown(); q.shutdown()                       # wakes a blocked dequeue/enqueue
    q = MessageQueue.create_from_process_group(pg, max_chunk_bytes, max_chunks, writer_rank=0)
"""
import socket
from collections import namedtuple

from ray_lite._fast import broadcast as _broadcast
from ray_lite._fast.errors import ChannelClosedError, PeerDiedError
from ray_lite._private.links import mq_network

__all__ = ["MessageQueue", "QueueHandle", "ChannelClosedError", "PeerDiedError"]

_ShmQueue = _broadcast.MessageQueue

QueueHandle = namedtuple("QueueHandle", "shm_handle local_reader_ranks remote_address authkey",
                         defaults=(None,))
QueueHandle.__doc__ = """What ``export_handle`` returns when some readers are remote
(or reader ranks are not ``0..n-1``): the shared-memory handle (None without
local readers), the ranks that read it (in shared-memory slot order), the
writer's ``(host, port)`` for the others (None without remote readers) and
the queue's secret that admits them (``authkey``, 32 bytes; None without
remote readers).  It is a credential: see ``MessageQueue``."""

# A reader waiting with ``cancel`` looks at the event this often.
_CANCEL_SLICE_S = 0.05


class MessageQueue:
    """The broadcast queue's public face: a shared-memory queue for the
    readers of this machine plus, when ``local_reader_ranks`` leaves some of
    the ``n_readers`` out, a TCP publisher (bound on ``connect_ip``) for the
    others.  Without remote readers ``enqueue``/``dequeue`` are the
    shared-memory queue's own (compiled) methods.

    The exported handle is a credential.  With remote readers it carries the
    queue's secret (``QueueHandle.authkey``, random per queue): a process
    that connects to the writer's address is admitted as a reader only after
    proving it holds that secret (HMACs of fresh random nonces, checked both
    ways and never replayed, so a reader never decodes anything from a peer posing as the writer), and
    anyone holding the handle can read every message.  Send the handle only
    over a trusted channel (the process group that starts the readers, a
    pipe, a file only its user can read), never over the network in clear.
    Shared-memory readers need no secret: the segments are readable by this
    user alone (mode 0600).
    """

    def __init__(self, n_readers, max_chunk_bytes=_broadcast.DEFAULT_MAX_CHUNK_BYTES,
                 max_chunks=_broadcast.DEFAULT_MAX_CHUNKS, *, local_reader_ranks=None,
                 connect_ip=None, **shm_options):
        n_readers = int(n_readers)
        if isinstance(max_chunk_bytes, int) and max_chunk_bytes < _broadcast.MIN_CHUNK_BYTES:
            # vLLM's constructor takes n_local_reader second: a port of
            # MessageQueue(3, 2) lands here, and deserves to be told so.
            raise ValueError(
                f"max_chunk_bytes={max_chunk_bytes} is below the minimum of "
                f"{_broadcast.MIN_CHUNK_BYTES} bytes. The second argument of ray_lite's "
                f"MessageQueue is max_chunk_bytes; vLLM's n_local_reader has no place here: "
                f"name the local readers with local_reader_ranks=[...] instead")
        if local_reader_ranks is None:
            local_reader_ranks = list(range(n_readers))
        local_reader_ranks = [int(r) for r in local_reader_ranks]
        if len(local_reader_ranks) > n_readers or len(set(local_reader_ranks)) != len(local_reader_ranks):
            raise ValueError(f"local_reader_ranks {local_reader_ranks} must be distinct and at "
                             f"most n_readers={n_readers}")
        n_remote = n_readers - len(local_reader_ranks)
        self._local_ranks = local_reader_ranks
        self._shm = self._net = None
        self._reader_rank = None
        self._shut_down = False
        if local_reader_ranks:
            self._shm = _ShmQueue(len(local_reader_ranks), max_chunk_bytes, max_chunks, **shm_options)
        try:
            if n_remote:
                self._net = mq_network.NetworkPublisher(n_remote, connect_ip or _node_ip(),
                                                        mq_network.new_authkey())
        except BaseException:
            self.close()
            raise
        self._n_readers = n_readers
        if self._net is None:
            self.enqueue = self._shm.enqueue  # the compiled method itself: no extra call

    @classmethod
    def _wrap(cls, shm=None, net=None, rank=None, n_readers=None):
        self = cls.__new__(cls)
        self._shm, self._net, self._reader_rank = shm, net, rank
        self._local_ranks = None
        self._shut_down = False
        self._n_readers = n_readers if shm is None else shm.n_readers
        return self

    # ------------------------------------------------------------ handles

    def export_handle(self):
        """A picklable handle for ``attach``/``create_from_handle``; with
        remote readers it holds the queue's secret: send it only over a
        trusted channel."""
        if not self.is_writer:
            raise ValueError("export_handle() is the writer's: a reader has nothing to share")
        if self._net is None and self._local_ranks == list(range(len(self._local_ranks))):
            return self._shm.export_handle()  # the plain shared-memory handle
        return QueueHandle(None if self._shm is None else self._shm.export_handle(),
                           list(self._local_ranks),
                           None if self._net is None else self._net.address,
                           None if self._net is None else self._net.authkey)

    @classmethod
    def attach(cls, handle, reader_rank):
        """Attach as reader ``reader_rank`` (see ``create_from_handle``)."""
        return cls.create_from_handle(handle, reader_rank)

    @classmethod
    def create_from_handle(cls, handle, rank, *, connect_timeout=60.0):
        """The reader end of rank ``rank``: shared memory when the handle
        lists ``rank`` as local, the writer's TCP publisher otherwise."""
        if not isinstance(handle, QueueHandle):
            return cls._wrap(shm=_ShmQueue.attach(handle, rank), rank=rank)
        if rank in handle.local_reader_ranks:
            slot = handle.local_reader_ranks.index(rank)
            return cls._wrap(shm=_ShmQueue.attach(handle.shm_handle, slot), rank=rank)
        if handle.remote_address is None:
            raise ValueError(f"rank {rank} is not a reader of this queue "
                             f"(local readers: {handle.local_reader_ranks}, no remote readers)")
        net = mq_network.NetworkReader(handle.remote_address, rank, handle.authkey, connect_timeout)
        return cls._wrap(net=net, rank=rank, n_readers=None)

    @classmethod
    def create_from_process_group(cls, pg, max_chunk_bytes, max_chunks, writer_rank=0, *,
                                  connect_ip=None):
        """Collective over the group ``pg`` (a torch.distributed group, or
        vLLM's ``StatelessProcessGroup``): rank ``writer_rank`` creates the
        queue (its readers are the other ranks of the group; those on its
        machine read shared memory) and broadcasts the handle; every rank
        returns its end, ready."""
        rank, world, all_gather, broadcast = _group_ops(pg, writer_rank)
        # Which ranks share the writer's machine: each says its host name.
        hosts = all_gather(socket.gethostname())
        if rank == writer_rank:
            local = [r for r in range(world) if r != writer_rank and hosts[r] == hosts[writer_rank]]
            queue = cls(world - 1, max_chunk_bytes, max_chunks, local_reader_ranks=local,
                        connect_ip=connect_ip)
            broadcast(queue.export_handle())
        else:
            queue = cls.create_from_handle(broadcast(None), rank)
        queue.wait_until_ready()
        return queue

    # ------------------------------------------------------------ messages

    def enqueue(self, obj, timeout=None):
        """Writer: broadcast ``obj`` to every reader, local and remote.
        ``shutdown()`` (from another thread) raises ``ChannelClosedError``,
        also in a send blocked on a remote reader that does not read."""
        try:
            if self._shm is not None:
                self._shm.enqueue(obj, timeout)
            self._net.publish(obj, timeout)
        except (OSError, ValueError) as exc:
            if self._shut_down:
                raise ChannelClosedError(f"{self!r} was shut down") from exc
            raise

    def dequeue(self, timeout=None, cancel=None):
        """Reader: the next message.  ``cancel`` (a ``threading.Event``) set
        while waiting raises ``RuntimeError("cancelled")``; ``shutdown()``
        (from another thread) raises ``ChannelClosedError``."""
        try:
            if self._net is not None:
                return self._net.dequeue(timeout, cancel)
            if cancel is None:
                return self._shm.dequeue(timeout)
            return self._dequeue_cancellable(timeout, cancel)
        except (OSError, ValueError) as exc:
            # A wait that shutdown() ended fails however the end was torn
            # down under it (a closed socket, a closed selector): say why.
            if self._shut_down:
                raise ChannelClosedError(f"{self!r} was shut down") from exc
            raise

    def _dequeue_cancellable(self, timeout, cancel):
        deadline = mq_network._deadline(timeout)
        while True:
            if cancel.is_set():
                raise RuntimeError(mq_network.CANCELLED_MESSAGE)
            left = mq_network._remaining(deadline)
            try:
                return self._shm.dequeue(_CANCEL_SLICE_S if left is None else min(left, _CANCEL_SLICE_S))
            except TimeoutError:
                if left is not None and left <= _CANCEL_SLICE_S:
                    raise

    def broadcast_object(self, obj=None):
        """The writer sends ``obj`` and returns it; a reader returns what the writer sent."""
        if self.is_writer:
            self.enqueue(obj)
            return obj
        return self.dequeue()

    def wait_until_ready(self, timeout=None):
        """Collective (the writer and every reader call it): returns once
        every remote reader is connected.  Shared-memory readers need no
        handshake (messages wait in the ring for a reader that attaches late)."""
        if self._net is not None:
            self._net.wait_until_ready(timeout)

    # ------------------------------------------------------------ the rest

    @property
    def is_writer(self):
        return self._reader_rank is None

    @property
    def reader_rank(self):
        return -1 if self._reader_rank is None else self._reader_rank

    @property
    def is_remote_reader(self):
        return self._reader_rank is not None and self._net is not None

    @property
    def n_readers(self):
        return self._n_readers

    @property
    def closed(self):
        return self._shm.closed if self._shm is not None else self._net._closed

    def close(self):
        """Idempotent; closes the shared-memory queue and the connections."""
        if self._shm is not None:
            self._shm.close()
        if self._net is not None:
            self._net.close()

    def shutdown(self):
        """vLLM's name: end this end of the queue for good.  Idempotent.  A
        reader or writer blocked in ``dequeue``/``enqueue`` on this end (in
        another thread) is woken with ``ChannelClosedError``, as is every
        later call; what the end holds is freed (the writer's: the segments
        and the readers' connections; its readers then read what was sent
        before, then get ``ChannelClosedError``)."""
        if self._shut_down:
            return
        self._shut_down = True
        # close() wakes a remote reader's dequeue waiting on its socket and
        # a writer's enqueue blocked in a send to a remote reader.
        self.close()

    def __getattr__(self, name):
        # The shared-memory queue's other names (fileno, enqueue_async,
        # dequeue_async, name, max_chunk_bytes, ...).
        shm = self.__dict__.get("_shm")
        if shm is None or name.startswith("__"):
            raise AttributeError(name)
        return getattr(shm, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        role = "writer" if self.is_writer else f"reader {self._reader_rank}"
        where = ("shared memory" if self._net is None else
                 "network" if self._shm is None else "shared memory + network")
        return f"<ray_lite.MessageQueue {role} over {where}>"


def _group_ops(pg, writer_rank):
    """``(rank, world_size, all_gather(obj), broadcast(obj))`` of ``pg`` from
    ``writer_rank``: vLLM's ``StatelessProcessGroup`` has them, a
    torch.distributed group (None: the default one) through ``torch.distributed``."""
    if hasattr(pg, "broadcast_obj"):
        return (pg.rank, pg.world_size, pg.all_gather_obj,
                lambda obj: pg.broadcast_obj(obj, writer_rank))
    import torch.distributed as dist
    world = dist.get_world_size(pg)
    src = dist.get_process_group_ranks(pg)[writer_rank] if pg is not None else writer_rank

    def all_gather(obj):
        out = [None] * world
        dist.all_gather_object(out, obj, group=pg)
        return out

    def broadcast(obj):
        box = [obj]
        dist.broadcast_object_list(box, src=src, group=pg)
        return box[0]
    return dist.get_rank(pg), world, all_gather, broadcast


def _node_ip():
    """This machine's address as other nodes see it."""
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"
