"""Actors share the fate of the process that created them, as in Ray.

An actor created by a task or another actor is owned by that worker's
process: when the process dies (a crash, ``kill``, an actor's restart), its
actors are ended with it, saying so.  The driver's own actors end with it
anyway.  A detached actor (``lifetime="detached"``) has no owner: it lives
until it is killed or the runtime ends.  (``ActorOwners`` is a part of the
driver's node: ``driver.owners``.)
"""

OWNER_DIED = ("The actor is dead because its owner has died: the worker process that "
              "created it exited.")


def owner_of(creator, request):
    """Who owns the actor an actor creation ``request`` of ``creator`` makes:
    the creator, or nobody (0) for ``lifetime="detached"``."""
    extra = request[10] if len(request) > 10 else None
    return 0 if extra and extra.get("detached") else creator


class ActorOwners:
    """Which process created which actor; ends them with their creator."""

    def __init__(self, driver):
        self.driver = driver
        self.owned = {}         # owner process id (a peer) -> the actors it created

    def owned_by(self, owner, info):
        """Record that ``owner`` created the actor ``info`` (returned as is)."""
        if owner != 0 and not isinstance(info, Exception):
            self.owned.setdefault(owner, set()).add(info.actor_id)
        return info

    def end_owned(self, owner):
        """``owner`` died: end the actors it created (none restarts)."""
        for aid in self.owned.pop(owner, ()):
            self.driver.kill_actor(aid, no_restart=True, cause=OWNER_DIED)
