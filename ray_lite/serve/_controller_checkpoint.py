"""The Serve controller's checkpoint: what a restarted controller recovers from.

The controller is a restartable actor (``max_restarts=-1``): when its
process dies the runtime starts a new one under the same name, and the new
one reads the last checkpoint and takes over the running applications,
replicas and proxies as they are (none is restarted).

The checkpoint is kept in memory by a small actor (``CheckpointStore``,
created with the controller, by the driver) rather than in a file: it holds
pickled actor handles and deployment code, which must be neither readable
nor replaceable by another local user, and a process's memory is private
where a shared temporary directory needs care; it ends with the runtime, so
a killed driver leaves no file behind.  The controller sends it a new state
on every change (``ServeController._save``): the messages of one sender
arrive in order, so the store always holds the latest state sent.  A
deployment's specification (its pickled class and arguments, possibly
large) is sent once per deploy, not with every change.
"""
import asyncio

from . import _core, context

STORE_NAME = "SERVE_CONTROLLER_CHECKPOINT"


class CheckpointStore:
    """The last state the controller saved, and each application's specs."""

    def __init__(self):
        self.state = None
        self.specs = {}         # application name -> {deployment name: spec}

    async def save(self, state, specs, dropped):
        self.state = state
        self.specs.update(specs)
        for name in dropped:
            self.specs.pop(name, None)

    async def load(self):
        if self.state is None:
            return None
        return self.state, self.specs

    async def wait_forever(self):
        await asyncio.get_running_loop().create_future()


def create_store():
    """The store (created by the driver that starts Serve; one per Serve)."""
    # Restartable: a new one starts empty and the controller, which watches
    # it, sends it the whole state again.
    cls = _core.remote(CheckpointStore).options(name=STORE_NAME,
                                                namespace=context.SERVE_NAMESPACE,
                                                get_if_exists=True, max_restarts=-1)
    return cls.remote()


def find_store():
    """The running store, or None (Serve started without one)."""
    try:
        return _core.get_actor(STORE_NAME, namespace=context.SERVE_NAMESPACE)
    except ValueError:
        return None
