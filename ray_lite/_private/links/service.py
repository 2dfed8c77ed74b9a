"""The driver's service thread: serves the links while no other thread drives them.

It takes over the links only when no thread has driven them for
``SERVICE_IDLE_S`` (up to ``SERVICE_PAUSE_MAX_S`` right after a long loop of
short waits), and then sleeps in ``poll`` on their descriptors (never
spins), so that workers are served while the user's code computes.  The
hand-over is lazy on purpose: a thread that enters and leaves ``get`` a
hundred thousand times a second pays two attribute updates, not a system
call, per wait, and this thread wakes at most every ``SERVICE_PAUSE_MAX_S``
meanwhile (each wake-up takes the GIL from that loop).
"""
import os
import select
import signal
import threading

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


class ServiceMixin:
    """The service thread's part of ``Node`` (only the driver starts it)."""

    def start_service(self):
        """Start the thread that serves the links while no other thread drives them."""
        self._kick_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        t = threading.Thread(target=self._service_main, name="ray_lite-service", daemon=True)
        self._service = t
        t.start()

    def stop_service(self, timeout=5.0):
        t = self._service
        if t is None:
            return
        self.closed = True
        self._kick()
        with self._svc_cond:
            self._svc_cond.notify_all()
        if t is not threading.current_thread():
            t.join(timeout)
        self._service = None
        fd, self._kick_fd = self._kick_fd, -1
        if fd >= 0:
            os.close(fd)

    def _kick(self, always=True):
        """Make the service thread leave ``poll`` (its set of descriptors changed)."""
        fd = self._kick_fd
        if fd >= 0 and (always or self._svc_listening):
            try:
                os.eventfd_write(fd, 1)
            except OSError:
                pass

    def _after_wait(self):
        # A thread left wait_until: wake a service thread parked for as long
        # as someone drives.  A wait that slept in poll disarmed the links'
        # descriptors on its way out, under whoever else listens to them: an
        # event loop's bridge, the service thread.  They re-arm.
        if self._svc_parked:
            with self._svc_cond:
                # One notify per sleep: the flag goes down here, not when the
                # woken thread runs (it needs the GIL first, and every get
                # that ended meanwhile would notify again).
                if self._svc_parked:
                    self._svc_parked = False
                    self._svc_cond.notify()
        if self._fds_touched:
            self._fds_touched = False
            for bridge in list(self._bridges.values()):
                bridge.rearm_soon()
            if self._svc_listening:
                self._kick(False)

    def _service_main(self):
        # Signals go to the main thread: a Ctrl-C taken by this thread would
        # leave the main thread asleep in poll, never raising KeyboardInterrupt.
        try:
            signal.pthread_sigmask(signal.SIG_BLOCK, _ASYNC_SIGNALS)
        except (OSError, ValueError):
            pass
        seen = -1
        cond = self._svc_cond
        lock = self._drive_lock
        fired = []
        woken = False
        pause = SERVICE_IDLE_S
        while not self.closed:
            epoch = self._wait_epoch
            if self._waiting or epoch != seen or lock.locked():
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
                    if self.closed:
                        break
                    if self._waiting and long_wait and not woken:
                        self._svc_parked = True
                        try:
                            woken = cond.wait(1.0)   # 1 s: a backstop, not a tick
                        finally:
                            self._svc_parked = False
                        pause = SERVICE_IDLE_S
                    else:
                        woken = False
                        cond.wait(pause)
                        pause = min(pause * 2, SERVICE_PAUSE_MAX_S)
                continue
            woken = False
            pause = SERVICE_IDLE_S
            if not lock.acquire(False):
                continue
            try:
                if self.closed:
                    break
                self._fds_touched = False
                fds = self._service_round(fired)
            except Exception:  # noqa: BLE001 - a bug here must not end serving
                import traceback
                traceback.print_exc()
                fds = None
            finally:
                self._release_drive()
            if fds is None:
                continue
            self._svc_listening = True
            try:
                if self._waiting or self._wait_epoch != seen or self.closed:
                    fired = []
                    continue
                p = select.poll()
                for fd in fds:
                    p.register(fd, select.POLLIN)
                ms = 1000 if WEAK_SLICE is None else int(WEAK_SLICE * 1000)
                try:
                    fired = [fd for fd, _ in p.poll(ms)]
                except OSError:
                    fired = []
            finally:
                self._svc_listening = False
            if self._kick_fd in fired:
                try:
                    os.eventfd_read(self._kick_fd)
                except OSError:
                    pass

    def _service_round(self, fired):
        """Under the drive lock: handle what woke us, drain, arm; the fds to poll."""
        self.on_sentinels_fired(fired)
        links = list(self.links.values())
        fired = set(fired)
        for link in links:
            if link.fileno() in fired:
                link.disarm()
        while True:
            self._drain()
            for link in links:
                if not link.arm():
                    break
            else:
                break
        return [lk.fileno() for lk in links] + list(self.sentinels) + [self._kick_fd]
