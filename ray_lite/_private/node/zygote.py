"""The zygote: a process that imports the runtime once and forks workers.

Started by the driver at ``init`` with the driver's ``sys.path`` and working
directory, so a forked worker has the runtime (and whatever the zygote
imported) loaded already and starts in about a millisecond.  The driver can
ask it to import more (``preload``: Serve's replica and proxy code, Starlette)
so that dozens of replicas do not each import them, and to fork many workers
in one request (``spawn_many``).

It also relays the workers' output: each worker's stdout/stderr is a pipe
that the zygote reads, writing every line to its own stdout/stderr (the
driver's terminal) prefixed with ``(pid=N)`` or ``(Label pid=N)``, as Ray does.

Life cycle: the zygote lives in its own session (a Ctrl-C in the driver's
terminal does not reach the workers), exits when the driver closes the
control socket or dies (it watches a pidfd of the driver), and before
exiting kills and reaps every worker, so that once the driver has reaped the
zygote no worker is left.  Workers die with the zygote (PR_SET_PDEATHSIG).
"""
import gc
import importlib
import os
import pickle
import selectors
import signal
import socket
import struct
import sys
import threading
import time

from ray_lite._lazy import lazy_module, resolve_loaded

from ..process.boot import python_argv
from ..process.interrupts import sleep_point

# The driver's side needs them; the zygote imports neither before its first fork.
cloudpickle = lazy_module("cloudpickle", globals())
subprocess = lazy_module("subprocess", globals())

_HEADER = struct.Struct("<I")
# A line a worker writes to its standard output to change the prefix of its
# output (an actor whose class defines __repr__: see relabel).  Set by the
# zygote, unguessable, inherited by the workers it forks; None elsewhere.
_LABEL_MARK = None
_LABEL_MAX = 200


def _send_frame(sock, obj, dumps=None):
    # cloudpickle (the driver's requests): an actor's constructor arguments
    # travel in the spawn spec, and may be instances of classes defined in a
    # function, or lambdas (as in Ray, whose arguments go by cloudpickle).
    # The zygote's replies are plain data: pickle.dumps.
    data = (dumps or cloudpickle.dumps)(obj, protocol=5)
    sock.sendall(_HEADER.pack(len(data)) + data)


def _as_sent(spec):
    """``spec`` as the zygote gets it: an actor's constructor arguments as
    bytes that the worker loads once it has its node.  Refs among them (an
    actor handle's lease) then bring their share of the count to the
    worker, which gives it back; loaded in the zygote, which has no node,
    the share was lost and what they held was kept for ever."""
    a = spec.get("actor")
    if a is None or "args" not in a:
        return spec
    a = dict(a)
    a["args_blob"] = cloudpickle.dumps((a.pop("args"), a.pop("kwargs")), protocol=5)
    return dict(spec, actor=a)


def _recv_exact(sock, n):
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise EOFError("zygote control socket closed")
        buf += chunk
    return bytes(buf)


def _recv_frame(sock):
    (size,) = _HEADER.unpack(_recv_exact(sock, 4))
    return pickle.loads(_recv_exact(sock, size))


class ZygoteClient:
    """The driver's side: starts the zygote, asks it for workers, stops it."""

    def __init__(self, early=False):
        self._lock = threading.Lock()
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock = parent
        driver_pid = os.getpid()
        # The zygote (and its workers) get the driver's sys.path, so they
        # import what the driver can, and the driver's very ray_lite.
        argv = python_argv("from ray_lite._private.node.zygote import main; main()", "zygote")
        main_thread = threading.current_thread() is threading.main_thread()
        try:
            self.proc = subprocess.Popen(
                argv + [str(child.fileno()), str(driver_pid), "1" if main_thread else "0",
                        "1" if early else "0"],
                pass_fds=(child.fileno(),), cwd=os.getcwd(), stdin=subprocess.DEVNULL,
                start_new_session=True, close_fds=True)
        finally:
            child.close()

    def spawn(self, spec, label=""):
        """Fork a worker running ``spec``; return its pid."""
        pid = self.spawn_many([(spec, label)])[0]
        if isinstance(pid, Exception):
            raise pid
        return pid

    def spawn_many(self, items):
        """Fork one worker per ``(spec, label)`` in a single round trip (Serve
        starts dozens of replicas at once); a list of pids, with a
        ``RuntimeError`` in place of each worker that could not be started."""
        items = [(_as_sent(spec), label) for spec, label in items]
        with self._lock:
            _send_frame(self._sock, ("spawn", items))
            replies = _recv_frame(self._sock)
        return [pid if status == "ok" else
                RuntimeError(f"the zygote could not start a worker: {pid}")
                for status, pid in replies]

    def set_sys_path(self, path):
        """Replace the zygote's ``sys.path``, and its environment variables and
        working folder with this process's now (no reply: before it reads the
        next request)."""
        with self._lock:
            _send_frame(self._sock, ("path", list(path), dict(os.environ), os.getcwd()))

    def preload(self, modules):
        """Have the zygote import ``modules`` so that workers forked later start
        with them loaded.  No reply: the zygote imports them before it reads
        the next request, so a spawn sent after this one waits for them while
        the driver goes on; a module that fails to import is skipped (a worker
        that needs it gets the error when it imports it itself)."""
        with self._lock:
            _send_frame(self._sock, ("preload", list(modules)))

    @sleep_point
    def stop(self, timeout=5.0):
        """Ask the zygote to end its workers and exit; reap it (kill if it lingers)."""
        try:
            with self._lock:
                _send_frame(self._sock, ("exit",))
        except OSError:
            pass
        try:
            self._sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout)
        self._sock.close()


# A zygote started ahead of the init() that adopts it (start_early).
_early = None


def start_early():
    """Start the zygote of the ``init()`` this process is about to make, now:
    ``ray-lite serve run`` does, so that the zygote's own start-up (Python,
    the runtime's imports, then the initial pool) runs beside the CLI's
    imports of Serve and of the application.  Not on the Ray backend."""
    global _early
    from ..process.backend import RAY_NAME, choose
    if _early is None and choose() != RAY_NAME:
        _early = ZygoteClient(early=True)


def adopt_early():
    """The zygote ``start_early`` started, or None; it gets this process's
    ``sys.path``, environment and folder as they are now (the application's
    folder went first since; its import may have set variables, such as
    ``OMP_NUM_THREADS``, that its workers must see)."""
    global _early
    client, _early = _early, None
    if client is not None:
        try:
            client.set_sys_path(sys.path)
        except OSError:     # it died meanwhile: init starts a fresh one
            client.stop()
            return None
    return client


def discard_early():
    """Stop the zygote ``start_early`` started if no ``init`` adopted it."""
    global _early
    client, _early = _early, None
    if client is not None:
        client.stop()


class _Relay:
    __slots__ = ("pid", "prefix", "target", "partial")

    def __init__(self, pid, prefix, target):
        self.pid = pid
        self.prefix = prefix
        self.target = target
        self.partial = b""


def _write_all(fd, data):
    view = memoryview(data)
    while view:
        try:
            n = os.write(fd, view)
        except BlockingIOError:
            time.sleep(0.001)
            continue
        except OSError:
            return
        view = view[n:]


def relabel(label):
    """In a worker forked by the zygote: prefix this process's output with
    ``(label pid=N)`` from now on (an actor's ``__repr__``, as in Ray)."""
    if _LABEL_MARK is None:
        return
    text = " ".join(str(label).split())[:_LABEL_MAX]
    try:
        sys.stdout.flush()
        os.write(1, _LABEL_MARK + text.encode("utf-8", "replace") + b"\n")
    except (OSError, ValueError):
        pass


def relabel_from_repr(actor):
    """An actor whose class defines ``__repr__`` prefixes its output with it
    (one whose ``__repr__`` fails keeps its class name)."""
    if type(actor).__repr__ is object.__repr__ or _LABEL_MARK is None:
        return
    try:
        label = repr(actor)
    except Exception:   # noqa: BLE001 - the user's __repr__: the class name stays
        return
    relabel(label)


def _spawn_worker(spec, label, ctrl, sel_fds):
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    zygote_pid = os.getpid()
    pid = os.fork()
    if pid == 0:  # the worker
        code = 1
        try:
            ctrl.close()
            for fd in sel_fds + [out_r, err_r]:
                try:
                    os.close(fd)
                except OSError:
                    pass
            os.dup2(out_w, 1)
            os.dup2(err_w, 2)
            os.close(out_w)
            os.close(err_w)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.default_int_handler)
            from ..process.procutil import die_with_parent
            die_with_parent(zygote_pid)
            try:
                sys.stdout.reconfigure(line_buffering=True)
                sys.stderr.reconfigure(line_buffering=True)
            except (AttributeError, ValueError):
                pass
            from . import worker
            worker.relabel_from_repr = relabel_from_repr
            worker.worker_main(spec)
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 0
        except BaseException:
            import traceback
            traceback.print_exc()
            code = 1
        finally:
            try:
                from ..actors.actor_exit import give_back_borrowed
                give_back_borrowed()
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                os._exit(code)
    os.close(out_w)
    os.close(err_w)
    return pid, out_r, err_r


def _freeze():
    # Objects the zygote holds move to the GC's permanent generation: the
    # collector in a worker then never writes to their headers, so the pages
    # the workers inherit stay shared instead of being copied into each one.
    # (No collection first: right after imports there is next to no garbage,
    # and init waits for this.)
    gc.freeze()


def _import_all(modules):
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception:   # noqa: BLE001 - optional (e.g. Serve's extras missing)
            pass


def _preload(modules):
    _import_all(modules)
    _freeze()


#: What ray_lite's modules import on first use (``ray_lite._lazy``) and the
#: zygote imports right after it has forked the initial pool (or before,
#: when it has nothing to do: no request yet): the workers it forks later
#: (actors, Serve's replicas) have them loaded and shared, so their first
#: call pays no import.  The initial pool workers were forked without them,
#: a few tens of milliseconds sooner, and import what they use (asyncio only
#: for an async task).
WARM_UP_MODULES = ("asyncio", "fractions")


def _warm_up():
    _import_all(WARM_UP_MODULES)
    resolve_loaded()
    _freeze()


def main():
    ctrl_fd, driver_pid, main_thread = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1"
    # Started ahead of its init (start_early): it warms up while it waits.
    # Otherwise the driver's spawn request is on its way: the initial pool
    # is forked first (see WARM_UP_MODULES), whoever is quicker.
    early = sys.argv[4] == "1"
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    from ..process.procutil import die_with_parent, open_sentinel
    if main_thread:
        # PDEATHSIG fires when the *thread* that forked us exits: only safe
        # when the driver started us from its main thread.  The pidfd below
        # covers the other case.
        die_with_parent(driver_pid)
    ctrl = socket.socket(fileno=ctrl_fd)
    global _LABEL_MARK
    _LABEL_MARK = b"\0ray_lite-label:" + os.urandom(8).hex().encode() + b":"
    driver_sentinel = open_sentinel(driver_pid)
    if driver_sentinel is None:
        return
    # Import once what every worker needs; forks inherit it.  The rest
    # (WARM_UP_MODULES) waits until the initial pool is forked.  cloudpickle
    # (with inspect) does not: the first task loads its function with it.
    from . import worker  # noqa: F401
    _import_all(("cloudpickle", "inspect"))
    resolve_loaded()
    _freeze()

    sel = selectors.DefaultSelector()
    sel.register(ctrl, selectors.EVENT_READ, "ctrl")
    sel.register(driver_sentinel, selectors.EVENT_READ, "driver")
    relays = {}        # read fd -> _Relay
    open_pipes = {}    # pid -> number of its pipes still open
    exiting = False
    deadline = None
    ctrl_buf = bytearray()
    warm = False

    def reap(pid):
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass

    def close_relay(fd):
        relay = relays.pop(fd)
        sel.unregister(fd)
        os.close(fd)
        if relay.partial:
            _write_all(relay.target, relay.prefix + relay.partial + b"\n")
        open_pipes[relay.pid] -= 1
        if open_pipes[relay.pid] == 0:
            del open_pipes[relay.pid]
            reap(relay.pid)

    def relabelled(relay, lines):
        """``lines`` less the relabel marks among them, applied to the
        process's two relays."""
        out = []
        for ln in lines:
            if ln.startswith(_LABEL_MARK):
                prefix = b"(" + ln[len(_LABEL_MARK):] + b" pid=%d) " % relay.pid
                for other in relays.values():
                    if other.pid == relay.pid:
                        other.prefix = prefix
            else:
                out.append(ln)
        return out

    def spawn(spec, label):
        try:
            pid, out_r, err_r = _spawn_worker(spec, label, ctrl,
                                              list(relays) + [driver_sentinel])
        except Exception as exc:  # fork failure, too many files, ...
            return ("error", repr(exc))
        prefix = (f"({label} pid={pid}) " if label else f"(pid={pid}) ").encode()
        for fd, target in ((out_r, 1), (err_r, 2)):
            relays[fd] = _Relay(pid, prefix, target)
            sel.register(fd, selectors.EVENT_READ, "out")
        open_pipes[pid] = 2
        return ("ok", pid)

    def begin_exit():
        nonlocal exiting, deadline
        if not exiting:
            exiting = True
            deadline = time.monotonic() + 2.0
            try:
                sel.unregister(ctrl)
            except (KeyError, ValueError):
                pass

    while True:
        if exiting:
            if not open_pipes:
                break
            timeout = deadline - time.monotonic()
            if timeout <= 0:
                for pid in list(open_pipes):
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                deadline = time.monotonic() + 5.0
                timeout = 5.0
            events = sel.select(timeout)
            if not events and timeout >= 5.0:
                break  # pragma: no cover (a worker that ignores SIGKILL's pipe EOF)
        else:
            events = sel.select(None if warm or not early else 0)
            if not events and not warm:
                # Nothing asked yet (a zygote started ahead of its init):
                # warm up now rather than after the first spawn.
                _warm_up()
                warm = True
                continue
        for key, _ in events:
            tag = key.data
            if tag == "ctrl":
                try:
                    chunk = ctrl.recv(1 << 16)
                except OSError:
                    chunk = b""
                if not chunk:
                    begin_exit()
                    continue
                ctrl_buf += chunk
                while len(ctrl_buf) >= 4:
                    (size,) = _HEADER.unpack_from(ctrl_buf, 0)
                    if len(ctrl_buf) < 4 + size:
                        break
                    req = pickle.loads(bytes(ctrl_buf[4:4 + size]))
                    del ctrl_buf[:4 + size]
                    if req[0] == "spawn":
                        _send_frame(ctrl, [spawn(spec, label) for spec, label in req[1]],
                                    pickle.dumps)
                        if not warm:        # the initial pool is forked: see WARM_UP_MODULES
                            _warm_up()
                            warm = True
                    elif req[0] == "preload":
                        _preload(req[1])
                    elif req[0] == "path":
                        sys.path[:] = req[1]
                        os.environ.clear()
                        os.environ.update(req[2])
                        os.chdir(req[3])
                    elif req[0] == "exit":
                        begin_exit()
                        break
            elif tag == "driver":
                # The driver died: no one will ever need these workers.
                for pid in list(open_pipes):
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                sel.unregister(driver_sentinel)
                begin_exit()
            else:
                fd = key.fd
                try:
                    data = os.read(fd, 1 << 16)
                except OSError:
                    data = b""
                if not data:
                    close_relay(fd)
                    continue
                relay = relays[fd]
                data = relay.partial + data
                lines = data.split(b"\n")
                relay.partial = lines.pop()
                if lines and _LABEL_MARK in data:
                    lines = relabelled(relay, lines)
                if lines:
                    p = relay.prefix
                    _write_all(relay.target, b"".join(p + ln + b"\n" for ln in lines))
    for pid in list(open_pipes):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        reap(pid)
