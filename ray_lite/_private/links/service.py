"""The driver's service thread: serves the links while no other thread drives them.

It takes over the links only when no thread has driven them for
``SERVICE_IDLE_S`` (up to ``SERVICE_PAUSE_MAX_S`` right after a long loop of
short waits), and then sleeps in ``poll`` on their descriptors (never
spins), so that workers are served while the user's code computes.  The
hand-over is lazy on purpose: a thread that enters and leaves ``get`` a
hundred thousand times a second pays two attribute updates, not a system
call, per wait, and this thread wakes at most every ``SERVICE_PAUSE_MAX_S``
meanwhile (each wake-up takes the GIL from that loop).

It also runs the node's timers (``call_later``): its waits end at the
earliest one's due time, whoever drives the links meanwhile.
"""
import heapq
import itertools
import os
import select
import signal
import threading
import time

from .transport import WEAK_SLICE

# The service thread takes the links over once nobody drove them for this long ...
SERVICE_IDLE_S = 0.005
# ... or, after a loop of short waits, for up to this long: the pause doubles
# while such a loop goes on (each look takes the GIL from it).
SERVICE_PAUSE_MAX_S = 0.04
_ASYNC_SIGNALS = {s for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT,
                              signal.SIGUSR1, signal.SIGUSR2, signal.SIGALRM, signal.SIGCHLD,
                              signal.SIGWINCH, signal.SIGPIPE)}
_ASYNC_SIGNALS.update(range(signal.SIGRTMIN, signal.SIGRTMAX + 1))


class ServiceThread:
    """The driver's service thread, a part of its ``Node`` (``node.service``):
    owns the thread, its condition, and what the node's waits read of it
    (``parked``, ``listening``).  Every node holds one; only the driver
    starts it."""

    def __init__(self, node):
        self.node = node
        self.thread = None
        self.cond = threading.Condition(threading.Lock())
        self.parked = False         # asleep until a wait ends (see unpark)
        self.listening = False      # asleep in poll on the links' descriptors
        self.kick_fd = -1           # eventfd: makes it leave poll
        self.timers = []            # heap of (due, seq, fn), under cond
        self._seq = itertools.count()

    def start(self):
        """Start the thread that serves the links while no other thread drives them."""
        self.kick_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        t = threading.Thread(target=self._main, name="ray_lite-service", daemon=True)
        self.thread = t
        t.start()

    def stop(self, timeout=5.0):
        t = self.thread
        if t is None:
            return
        self.node.closed = True
        self.kick()
        with self.cond:
            self.cond.notify_all()
        if t is not threading.current_thread():
            t.join(timeout)
        self.thread = None
        fd, self.kick_fd = self.kick_fd, -1
        if fd >= 0:
            os.close(fd)

    def kick(self, always=True):
        """Make the thread leave ``poll`` (its set of descriptors changed);
        ``always=False``: only if it is in ``poll``."""
        fd = self.kick_fd
        if fd >= 0 and (always or self.listening):
            try:
                os.eventfd_write(fd, 1)
            except OSError:
                pass

    def call_later(self, delay, fn):
        """Run ``fn()`` on this thread ``delay`` seconds from now (once)."""
        with self.cond:
            heapq.heappush(self.timers, (time.monotonic() + delay, next(self._seq), fn))
            self.cond.notify()          # a wait that ends later than this is cut short
        self.kick(always=False)

    def _wait_s(self, cap):
        """``cap``, or less: the time until the earliest timer is due."""
        timers = self.timers
        if not timers:
            return cap
        return max(0.0, min(cap, timers[0][0] - time.monotonic()))

    def _run_due(self):
        due = []
        with self.cond:
            now = time.monotonic()
            while self.timers and self.timers[0][0] <= now:
                due.append(heapq.heappop(self.timers)[2])
        for fn in due:
            try:
                fn()
            except Exception:  # noqa: BLE001 - a failing timer must not end serving
                import traceback
                traceback.print_exc()

    def unpark(self):
        """A thread left a wait: wake the thread if it is parked for as long
        as someone drives."""
        with self.cond:
            # One notify per sleep: the flag goes down here, not when the
            # woken thread runs (it needs the GIL first, and every get
            # that ended meanwhile would notify again).
            if self.parked:
                self.parked = False
                self.cond.notify()

    def _main(self):
        # Signals go to the main thread: a Ctrl-C taken by this thread would
        # leave the main thread asleep in poll, never raising KeyboardInterrupt.
        try:
            signal.pthread_sigmask(signal.SIG_BLOCK, _ASYNC_SIGNALS)
        except (OSError, ValueError):
            pass
        node = self.node
        seen = -1
        cond = self.cond
        lock = node._drive_lock
        fired = []
        woken = False
        pause = SERVICE_IDLE_S
        while not node.closed:
            if self.timers:
                self._run_due()
            epoch = node._wait_epoch
            if node._waiting or epoch != seen or lock.locked():
                # Someone drives, or did lately (a loop of gets): stand aside.
                # Only a wait that is still the same one after a whole pause
                # (a long wait) lets this thread sleep until it leaves (one
                # notify).  A loop of short gets sees the epoch move at every
                # look, and this thread only wakes once per pause: parking
                # there would cost a notify per pause, and each wake-up
                # takes the GIL from the loop, and with it, when it runs
                # late, the spin its worker waits in (B11).
                long_wait = epoch == seen
                seen = epoch
                fired = []      # stale once someone else drove (fds get reused)
                with cond:
                    if node.closed:
                        break
                    if node._waiting and long_wait and not woken:
                        self.parked = True
                        try:
                            woken = cond.wait(self._wait_s(1.0))   # 1 s: a backstop, not a tick
                        finally:
                            self.parked = False
                        pause = SERVICE_IDLE_S
                    else:
                        woken = False
                        cond.wait(self._wait_s(pause))
                        pause = min(pause * 2, SERVICE_PAUSE_MAX_S)
                continue
            woken = False
            pause = SERVICE_IDLE_S
            if not lock.acquire(False):
                continue
            try:
                if node.closed:
                    break
                node._fds_touched = False
                fds = self._round(fired)
            except Exception:  # noqa: BLE001 - a bug here must not end serving
                import traceback
                traceback.print_exc()
                fds = None
            finally:
                node._release_drive()
            if fds is None:
                continue
            self.listening = True
            try:
                if node._waiting or node._wait_epoch != seen or node.closed:
                    fired = []
                    continue
                p = select.poll()
                for fd in fds:
                    p.register(fd, select.POLLIN)
                ms = 1000 if WEAK_SLICE is None else int(WEAK_SLICE * 1000)
                if self.timers:
                    ms = min(ms, int(self._wait_s(ms / 1000) * 1000) + 1)
                try:
                    fired = [fd for fd, _ in p.poll(ms)]
                except OSError:
                    fired = []
            finally:
                self.listening = False
            if self.kick_fd in fired:
                try:
                    os.eventfd_read(self.kick_fd)
                except OSError:
                    pass

    def _round(self, fired):
        """Under the drive lock: handle what woke us, drain, arm; the fds to poll."""
        node = self.node
        node.on_sentinels_fired(fired)
        links = node.all_links()
        fired = set(fired)
        for link in links:
            if link.fileno() in fired:
                link.disarm()
        while True:
            node._drain()
            for link in links:
                if not link.arm():
                    break
            else:
                break
        return [lk.fileno() for lk in links] + list(node.sentinels) + [self.kick_fd]
