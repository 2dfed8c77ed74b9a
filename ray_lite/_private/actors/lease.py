"""What keeps an actor in scope: its creator's lease, counted as refs are."""
from ..objects.refs import ObjectRef, _Entry


class _ActorLease(_Entry):
    """What keeps an actor in scope: an object of its creator's that is never
    filled.  The creator's handle holds a ref to it, and a copy of the
    handle passed to another process carries the ref along, with a share
    of the creator's count (refs.py's weighted reference counting).  When
    the last ref is gone, here and in every other process, this entry dies
    and the actor is ended as Ray ends an actor out of scope: after the
    calls sent to it before."""

    __slots__ = ("node", "actor_id")

    def __init__(self, node, actor_id):
        _Entry.__init__(self)
        self.node = node
        self.actor_id = actor_id

    def __del__(self):
        node = self.node
        if node is not None:
            self.node = None
            node.actor_handle_dropped(self.actor_id)


def actor_lease(node, actor_id):
    """The ref that the handle ``node`` got on creating actor ``actor_id`` holds."""
    return ObjectRef(node.new_oid(), node.id, _ActorLease(node, actor_id))
