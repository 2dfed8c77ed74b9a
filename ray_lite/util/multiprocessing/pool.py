"""``Pool``: the standard library's ``multiprocessing.Pool`` on ray_lite actors.

Each of the pool's processes is an actor.  Work goes to them in chunks, one
actor call per chunk (``map`` picks the chunk size as the standard library
does), so a map over many tiny items costs a handful of round trips.  The
function travels as a cloudpickle blob, which each actor unpickles once and
keeps: a lambda or a closure works as well as a module-level function.

Differences from the standard library, all in the direction of not hanging:
a worker that dies fails the chunks it held (``map`` raises the core's
``RayActorError``) and is replaced for later work; ``terminate`` fails the
results still pending instead of leaving them unfinished forever.  As in
Ray's pool, ``imap``/``imap_unordered`` hand back an item's error as that
item's result and go on (the standard library raises it and, with chunks of
several items, ends the iteration), and take a non-iterable argument as one
item, with a ``RayDeprecationWarning``.

Callbacks run on one thread per pool (started with the first result that has
a callback), as the standard library runs them on its result-handler thread:
never on the thread that reads the actors' answers, so a callback may submit
more work or wait for other results.
"""
import functools
import itertools
import os
import queue
import sys
import threading
import time
import traceback
import warnings
import weakref
from multiprocessing import TimeoutError

import cloudpickle

import ray_lite
from ray_lite._private.objects.refs import pinning_refs
from ray_lite._private.objects.shipping import shipped_form, unship
from ray_lite._private.process import backend as _backend
from ray_lite._private.process.errors import make_task_error
from ray_lite.exceptions import FunctionRaisedActorError, RayActorError, RayDeprecationWarning

__all__ = ["Pool", "AsyncResult", "IMapIterator", "FunctionRaisedActorError"]

# Chunks in flight per worker while an imap iterator is consumed: enough to
# keep each worker busy while its previous answer travels back.
_IMAP_CHUNKS_PER_WORKER = 4
# ready() waits this long at most: long enough to read what has arrived (a
# wait of 0 only looks), short enough not to be felt.
_READ_ARRIVALS_S = 1e-4
# Functions each worker keeps unpickled (a pool is usually fed a few).
_FUNCTION_CACHE = 32


def _function_name(fn):
    """What a failure of ``fn`` is headed with, as a task's is with its function's."""
    fn = getattr(fn, "func", fn)            # functools.partial: the function it calls
    return getattr(fn, "__qualname__", None) or type(fn).__qualname__


def _item_error(fn, exc):
    """What the pool's function raising ``exc`` is sent back as: the error of
    a task named after the function, whose traceback starts at the function
    (the worker's own frames left out, as a task's are).  A ``RayActorError``
    it raised (an actor it called died) becomes ``FunctionRaisedActorError``,
    which the pool tells from its own worker's death."""
    if isinstance(exc, RayActorError) and not isinstance(exc, FunctionRaisedActorError):
        exc = FunctionRaisedActorError(str(exc)).with_traceback(exc.__traceback__)
    return make_task_error(_function_name(fn), exc)


class _ItemFailed:
    """In the results of a chunk run item by item: the error of one item
    (told from a value, which may be an exception the function returned)."""
    __slots__ = ("error",)

    def __init__(self, error):
        self.error = error

    def __reduce__(self):
        return _ItemFailed, (self.error,)


class _PoolWorker:
    """The actor behind one of the pool's processes."""

    def __init__(self, init_blob):
        self._functions = {}
        if init_blob is not None:
            initializer, initargs = init_blob
            initializer = unship(initializer)
            try:
                initializer(*cloudpickle.loads(initargs))
            except Exception as exc:
                raise _item_error(initializer, exc) from None

    def _function(self, blob):
        fn = self._functions.get(blob)
        if fn is None:
            if len(self._functions) >= _FUNCTION_CACHE:
                self._functions.clear()
            # (Its file name restored: a function of __main__ travels by value.)
            fn = self._functions[blob] = unship(blob)
        return fn

    def run_chunk(self, blob, chunk, star):
        fn = self._function(blob)
        try:
            if star:
                return [fn(*args) for args in chunk]
            return [fn(x) for x in chunk]
        except Exception as exc:
            raise _item_error(fn, exc) from None

    def run_items(self, blob, chunk, star):
        """Each item's value, or its error as an ``_ItemFailed`` (imap's chunks)."""
        fn = self._function(blob)
        out = []
        for item in chunk:
            try:
                out.append(fn(*item) if star else fn(item))
            except Exception as exc:
                out.append(_ItemFailed(_item_error(fn, exc)))
        return out

    def run_call(self, blob, args, kwds):
        fn = self._function(blob)
        try:
            return fn(*args, **kwds)
        except Exception as exc:
            raise _item_error(fn, exc) from None


_pool_worker_class = functools.cache(lambda: ray_lite.remote(_PoolWorker))


def _default_processes():
    resources = getattr(ray_lite, "cluster_resources", None)
    if resources is not None:
        try:
            return max(1, int(resources().get("CPU", 0)))
        except Exception:   # an older core without the resource table
            pass
    return os.cpu_count() or 1


class _CallbackRunner:
    """The thread that runs a pool's result callbacks, started on first use.

    It sleeps on a queue while there is nothing to run (it never polls).
    """

    def __init__(self):
        self._jobs = queue.SimpleQueue()
        self._thread = None
        self._stopped = False
        self._lock = threading.Lock()

    def submit(self, job):
        """Run ``job()`` on the thread; False once the runner was stopped."""
        with self._lock:
            if self._stopped:
                return False
            if self._thread is None:
                self._thread = threading.Thread(target=self._main, daemon=True,
                                                name="ray_lite-pool-callbacks")
                self._thread.start()
            self._jobs.put(job)
            return True

    def _main(self):
        while True:
            job = self._jobs.get()
            if job is None:
                return
            job()

    def stop(self):
        """Run the jobs already submitted, then end the thread."""
        with self._lock:
            self._stopped = True
            thread = self._thread
            if thread is not None:
                self._jobs.put(None)
        if thread is not None and thread is not threading.current_thread():
            thread.join()


def _call_user_callback(fn, arg):
    try:
        fn(arg)
    except Exception:   # a callback's error must not stop the others
        print("Exception in a ray_lite Pool callback:", file=sys.stderr)
        traceback.print_exc()


def _collect(pool, calls, single):
    """``(True, value)`` from the answered ``calls``, or ``(False, first error)``
    in call order.  A call that failed with its worker's death has the pool
    replace that worker."""
    values, error = [], None
    for ref, slot, actor in calls:
        try:
            value = ray_lite.get(ref)
        except RayActorError as exc:
            if pool is not None and not isinstance(exc, FunctionRaisedActorError):
                pool._worker_died(slot, actor)
            error = error or exc
            continue
        except Exception as exc:
            error = error or exc
            continue
        if single:
            values = value
        else:
            values.extend(value)
    return (True, values) if error is None else (False, error)


def _result_of(pool, calls, single):
    """Wait for ``calls`` and return their value or raise their first error
    (``map``/``apply``: no ``AsyncResult`` needed)."""
    if calls:
        ray_lite.wait([c[0] for c in calls], num_returns=len(calls))
    ok, value = _collect(pool, calls, single)
    if ok:
        return value
    raise value


class AsyncResult:
    """The result of ``apply_async``/``map_async``/``starmap_async``."""

    def __init__(self, pool, calls, single, callback=None, error_callback=None):
        self._pool = pool
        self._calls = calls                  # [(ref, slot, actor)] in order
        self._single = single
        self._callback = callback
        self._error_callback = error_callback
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._left = len(calls)
        self._success = None
        self._value = None
        if not calls:
            self._finish()
            return
        pool._pending.add(self)
        for ref, _, _ in calls:
            ref.future().add_done_callback(self._call_done)

    def _call_done(self, _future):
        with self._lock:
            self._left -= 1
            last = self._left == 0
        if last:
            self._finish()

    def _finish(self):
        # Runs on the thread that read the last answer: no user code here.
        pool, self._pool = self._pool, None
        self._success, self._value = _collect(pool, self._calls, self._single)
        self._calls = None
        if pool is not None:
            pool._pending.discard(self)
        callback = self._callback if self._success else self._error_callback
        if callback is None or pool is None or not pool._callbacks.submit(self._run_callback):
            self._event.set()

    def _run_callback(self):
        callback = self._callback if self._success else self._error_callback
        _call_user_callback(callback, self._value)
        self._event.set()

    def ready(self):
        """Whether the result is known (every chunk answered)."""
        if not self._event.is_set():
            calls = self._calls
            if calls:
                # Read what has arrived: a process without a service thread
                # (a task, an actor) has nobody else to read it.
                refs = [c[0] for c in calls]
                ray_lite.wait(refs, num_returns=len(refs), timeout=_READ_ARRIVALS_S)
        return self._event.is_set()

    def successful(self):
        """Whether no chunk failed; ``ValueError`` if the result is not ready."""
        if not self.ready():
            raise ValueError(f"{self!r} not ready")
        return self._success

    def wait(self, timeout=None):
        """Wait (at most ``timeout`` s) for the result to be ready."""
        if self._event.is_set():
            return
        calls = self._calls
        if calls:
            refs = [c[0] for c in calls]
            start = time.monotonic()
            ray_lite.wait(refs, num_returns=len(refs), timeout=timeout)
            if timeout is not None:
                timeout = max(0.0, timeout - (time.monotonic() - start))
        self._event.wait(timeout)

    def get(self, timeout=None):
        """The value (``TimeoutError`` if not ready within ``timeout`` s), or
        the first error a chunk raised."""
        self.wait(timeout)
        if not self._event.is_set():
            raise TimeoutError
        if self._success:
            return self._value
        raise self._value


class IMapIterator:
    """The iterator ``imap``/``imap_unordered`` return (``next(timeout=None)``).

    Chunks are submitted as results are taken, a few per worker ahead, so an
    endless iterable works.  As in Ray's pool, an item whose call raised has
    that error (a ``RayTaskError`` that is also the function's exception
    class, as ``map`` raises it) as its result, and the iteration goes on;
    the items of a chunk whose worker died each have the core's
    ``RayActorError``.
    """

    def __init__(self, pool, blob, iterable, chunksize, star, ordered):
        self._pool = pool
        self._blob = blob
        self._items = iter(iterable)
        self._chunksize = chunksize
        self._star = star
        self._ordered = ordered
        self._inflight = []          # [(ref, slot, actor, items)] in submission order
        self._values = []            # values of answered chunks, handed out first
        self._next_value = 0
        self._exhausted = False
        self._ended = False
        self._window = _IMAP_CHUNKS_PER_WORKER * pool._processes
        pool._iterators.add(self)
        self._fill(self._window)

    def _fill(self, window):
        while not self._exhausted and len(self._inflight) < window:
            chunk = list(itertools.islice(self._items, self._chunksize))
            if not chunk:
                self._exhausted = True
                break
            call = self._pool._submit("run_items", self._blob, chunk, self._star)
            self._inflight.append((*call, len(chunk)))

    def _submit_all(self):
        self._fill(float("inf"))

    def __iter__(self):
        return self

    def __next__(self):
        return self.next()

    def next(self, timeout=None):
        if self._next_value < len(self._values):
            value = self._values[self._next_value]
            self._next_value += 1
            return value.error if type(value) is _ItemFailed else value
        if self._ended:
            raise StopIteration
        self._fill(self._window)
        inflight = self._inflight
        if not inflight:
            self._ended = True
            raise StopIteration
        if self._ordered:
            call = inflight[0]
            ready, _ = ray_lite.wait([call[0]], timeout=timeout)
        else:
            ready, _ = ray_lite.wait([c[0] for c in inflight], num_returns=1, timeout=timeout)
            call = next(c for c in inflight if c[0] == ready[0]) if ready else None
        if not ready:
            raise TimeoutError
        inflight.remove(call)
        self._fill(self._window)
        ref, slot, actor, items = call
        try:
            values = ray_lite.get(ref)
        except Exception as exc:
            # The whole chunk failed (its worker died): each item has the error.
            if isinstance(exc, RayActorError) and not isinstance(exc, FunctionRaisedActorError):
                self._pool._worker_died(slot, actor)
            values = [_ItemFailed(exc)] * items
        self._values = values
        self._next_value = 0
        return self.next()


@_backend.ray_counterpart("Pool")
class Pool:
    """A pool of ``processes`` workers (default: the CPUs ray_lite was started
    with), each an actor that runs ``initializer(*initargs)`` first.

    As the standard library's: ``map``, ``map_async``, ``imap``,
    ``imap_unordered``, ``starmap``, ``starmap_async``, ``apply``,
    ``apply_async``, ``close``, ``terminate``, ``join``, and ``with Pool() as p``
    (which terminates it at the end).  ``maxtasksperchild`` replaces a worker
    after that many chunks.  ``context`` is ignored; ``ray_remote_args`` are
    the workers' actor options.  As Ray's: starts ray_lite (a CPU per process) if it
    is not running, refuses more processes than its CPUs, and returns once
    every worker has run ``initializer``.
    """

    def __init__(self, processes=None, initializer=None, initargs=None, maxtasksperchild=None,
                 context=None, ray_address=None, ray_remote_args=None):
        self._state = "INIT"
        self._actors = []
        self._retired = []               # (actor, last call): killed once it answered
        self._callbacks = _CallbackRunner()
        if processes is not None and (not isinstance(processes, int)
                                      or isinstance(processes, bool)):
            raise TypeError(f"processes must be an int or None, got {type(processes).__name__}")
        if processes is not None and processes < 1:
            raise ValueError("Number of processes must be at least 1")
        if maxtasksperchild is not None and (not isinstance(maxtasksperchild, int)
                                             or maxtasksperchild <= 0):
            raise ValueError("maxtasksperchild must be a positive int or None")
        if initializer is not None and not callable(initializer):
            raise TypeError("initializer must be a callable")
        if not ray_lite.is_initialized():
            # As Ray's pool: the runtime it starts has a CPU per process.
            ray_lite.init(address=ray_address, num_cpus=processes)
        cpus = _default_processes()
        if processes is None:
            processes = cpus
        elif processes > cpus:
            raise ValueError(f"Tried to start a pool with {processes} processes on a runtime "
                             f"with {cpus} CPUs (Ray refuses it too): ask for at most {cpus}")
        self._processes = processes
        if initializer is None:
            self._init_blob = None
        else:
            with pinning_refs():    # loaded by every worker
                self._init_blob = (cloudpickle.dumps(shipped_form(initializer)),
                                   cloudpickle.dumps(tuple(initargs or ())))
        self._maxtasksperchild = maxtasksperchild
        self._remote_args = dict(ray_remote_args or {})
        self._pending = set()            # AsyncResults not finished yet
        self._iterators = weakref.WeakSet()
        self._next_slot = 0
        self._calls_per_slot = [0] * self._processes
        self._actors = [self._new_actor() for _ in range(self._processes)]
        try:
            # As Ray's: every worker has run the initializer when the pool is
            # returned (one that raised fails this with RayActorError).
            ray_lite.get([a.__ray_ready__.remote() for a in self._actors])
        except BaseException:
            self.terminate()
            raise
        self._state = "RUN"

    def __repr__(self):
        return (f"<{type(self).__module__}.{type(self).__qualname__} state={self._state} "
                f"pool_size={self._processes}>")

    def __reduce__(self):
        raise NotImplementedError("pool objects cannot be passed between processes or "
                                  "pickled")

    # --------------------------------------------------------------- workers
    def _new_actor(self):
        cls = _pool_worker_class()
        if self._remote_args:
            cls = cls.options(**self._remote_args)
        return cls.remote(self._init_blob)

    def _worker_died(self, slot, actor):
        """A call to ``actor`` failed with its death: the next call gets a new one."""
        actors = self._actors
        if slot < len(actors) and actors[slot] is actor:
            actors[slot] = None

    def _submit(self, method, *args):
        """One call to the next worker in turn: ``(ref, slot, actor)``."""
        if self._state == "TERMINATE":
            raise ValueError("Pool not running")
        slot = self._next_slot
        self._next_slot = (slot + 1) % self._processes
        actor = self._actors[slot]
        if actor is None:
            actor = self._actors[slot] = self._new_actor()
        ref = getattr(actor, method).remote(*args)
        if self._maxtasksperchild is not None:
            self._calls_per_slot[slot] += 1
            if self._calls_per_slot[slot] >= self._maxtasksperchild:
                # Retired: it finishes what it was given (its calls run in
                # order), then it is killed; the slot gets a new worker.
                self._calls_per_slot[slot] = 0
                self._actors[slot] = None
                self._retired.append((actor, ref))
            if self._retired:
                self._reap_retired()
        return ref, slot, actor

    def _reap_retired(self, wait=False):
        still = []
        for actor, last in self._retired:
            if wait:
                ray_lite.wait([last])
            if ray_lite.wait([last], timeout=0)[0]:
                _kill_quietly(actor)
            else:
                still.append((actor, last))
        self._retired = still

    def _check_running(self):
        if self._state != "RUN":
            raise ValueError("Pool not running")

    @staticmethod
    def _blob(func):
        if not callable(func):
            raise TypeError(f"{type(func).__name__!r} object is not callable")
        with pinning_refs():    # loaded by every worker that runs a chunk
            return cloudpickle.dumps(shipped_form(func))

    # ----------------------------------------------------------------- apply
    def apply(self, func, args=(), kwds=None):
        """``func(*args, **kwds)`` in a worker; waits for and returns its result."""
        self._check_running()
        call = self._submit("run_call", self._blob(func), tuple(args), dict(kwds or {}))
        return _result_of(self, [call], True)

    def apply_async(self, func, args=(), kwds=None, callback=None, error_callback=None):
        """``func(*args, **kwds)`` in a worker, as an ``AsyncResult``."""
        self._check_running()
        call = self._submit("run_call", self._blob(func), tuple(args), dict(kwds or {}))
        return AsyncResult(self, [call], True, callback, error_callback)

    # ------------------------------------------------------------------- map
    def map(self, func, iterable, chunksize=None):
        """``[func(x) for x in iterable]``, computed by the workers in chunks."""
        return _result_of(self, self._map_calls(func, iterable, chunksize, False), False)

    def map_async(self, func, iterable, chunksize=None, callback=None, error_callback=None):
        return self._map_async(func, iterable, chunksize, False, callback, error_callback)

    def starmap(self, func, iterable, chunksize=None):
        """``[func(*args) for args in iterable]``."""
        return _result_of(self, self._map_calls(func, iterable, chunksize, True), False)

    def starmap_async(self, func, iterable, chunksize=None, callback=None,
                      error_callback=None):
        return self._map_async(func, iterable, chunksize, True, callback, error_callback)

    def _map_async(self, func, iterable, chunksize, star, callback=None, error_callback=None):
        calls = self._map_calls(func, iterable, chunksize, star)
        return AsyncResult(self, calls, False, callback, error_callback)

    def _map_calls(self, func, iterable, chunksize, star):
        """One ``run_chunk`` call per chunk of ``iterable`` (sized as the stdlib sizes them)."""
        self._check_running()
        blob = self._blob(func)
        if not hasattr(iterable, "__len__"):
            iterable = list(iterable)
        n = len(iterable)
        if chunksize is None:
            # As the standard library: about four chunks per worker.
            chunksize, extra = divmod(n, self._processes * 4)
            if extra:
                chunksize += 1
        elif not isinstance(chunksize, int) or chunksize < 1:
            raise ValueError(f"Chunksize must be 1+, not {chunksize!r}")
        items = iterable if isinstance(iterable, (list, tuple)) else list(iterable)
        return [self._submit("run_chunk", blob, list(items[i:i + chunksize]), star)
                for i in range(0, n, chunksize or 1)]

    def imap(self, func, iterable, chunksize=1):
        """An iterator over ``func(x)`` in order, computed ahead as it is consumed."""
        return self._imap(func, iterable, chunksize, True)

    def imap_unordered(self, func, iterable, chunksize=1):
        """Like ``imap``, in the order the results come."""
        return self._imap(func, iterable, chunksize, False)

    def _imap(self, func, iterable, chunksize, ordered):
        self._check_running()
        if not isinstance(chunksize, int) or chunksize < 1:
            raise ValueError(f"Chunksize must be 1+, not {chunksize!r}")
        try:
            iter(iterable)
        except TypeError:
            # Ray's pool takes it as one item, and warns that it will stop.
            warnings.warn(f"Passing a non-iterable argument ({type(iterable).__name__}) to "
                          f"Pool.imap or Pool.imap_unordered is deprecated, as in Ray: it is "
                          f"taken as one item. Pass [x] instead.", RayDeprecationWarning,
                          stacklevel=3)
            iterable = [iterable]
        return IMapIterator(self, self._blob(func), iterable, chunksize, False, ordered)

    # ------------------------------------------------------------- lifetime
    def close(self):
        """No more work may be submitted; the workers end after it (``join``)."""
        if self._state == "RUN":
            self._state = "CLOSE"

    def terminate(self):
        """Stop the workers now; results still pending fail (``RayActorError``)."""
        if self._state == "TERMINATE":
            return
        self._state = "TERMINATE"
        self._stop_workers()

    def join(self):
        """Wait for the work submitted to finish and the workers to end
        (after ``close`` or ``terminate``)."""
        if self._state == "RUN":
            raise ValueError("Pool is still running")
        if self._state == "CLOSE":
            for it in list(self._iterators):
                it._submit_all()
            refs = [c[0] for it in list(self._iterators) for c in it._inflight]
            if refs:
                ray_lite.wait(refs, num_returns=len(refs))
            for result in list(self._pending):
                result.wait()
            self._state = "TERMINATE"
        self._stop_workers()

    def _stop_workers(self):
        actors, self._actors = self._actors, []
        retired, self._retired = self._retired, []
        if ray_lite.is_initialized():
            for actor in actors + [a for a, _ in retired]:
                if actor is not None:
                    _kill_quietly(actor)
        self._callbacks.stop()

    def __enter__(self):
        self._check_running()
        return self

    def __exit__(self, *exc_info):
        self.terminate()

    def __del__(self):
        if getattr(self, "_state", None) == "RUN":
            warnings.warn(f"unclosed running ray_lite pool {self!r}", ResourceWarning,
                          source=self)
            try:
                self.terminate()
            except Exception:   # the runtime may be gone already (interpreter exit)
                pass


def _kill_quietly(actor):
    try:
        ray_lite.kill(actor)
    except Exception:   # already dead, or the runtime is shutting down
        pass
