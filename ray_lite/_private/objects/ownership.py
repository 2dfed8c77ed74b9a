"""Objects across processes: results, lending and borrowing refs, fetching values.

Weighted reference counting of refs that leave the process unready (see
``refs.py``): weights are exact fractions; the owner lends 1 per
serialisation, a borrower halves what it holds to pass a ref on.

A share cannot come back from a process that died.  So each borrower
reports to the owner what it received and what it passed on
(``HolderWeight``, batched with its releases), and the owner keeps, per
borrower, what it holds now (``holders``): when the borrower dies, the owner
takes that back itself (``release_dead_holder``), as Ray's owner drops a
dead borrower's references.

``Objects`` is a part every node holds (``node.objects``): it owns what this
process lends and borrows (``exported``, ``holders``, ``borrowed``, the
fetches) and handles ``FETCH``, ``FETCHED`` and ``RELEASE``.  The results a
process expects (``pending``, ``inflight``) and ``RESULT`` are the node's
own (``node.py``): the compiled pool book and task runner read them there.
The weights to give back wait in the node's ``_releases`` (read by the task
runner after every task) until a drain sends them (``send_releases``).
"""
import threading
import weakref

from ray_lite._lazy import lazy_module
from ray_lite.exceptions import ObjectLostError, OwnerDiedError

from ..links import protocol as P
from ..links.transport import LinkClosed
from .entries import _IMMUTABLE, HolderWeight, keep_private
from .refs import (LoadedValue, ObjectRef, StoredValue, _BorrowedEntry, _MappedEntry,
                   error_entry, loaded, map_stored, stored_form)

# Weights are fractions once a borrower passes a ref on; fractions imports
# decimal, which a process that never does is spared.
fractions = lazy_module("fractions", globals())


class Objects:
    """Objects lent and borrowed, fetched from their owners (a part of ``Node``,
    ``node.objects``)."""

    def __init__(self, node):
        self.node = node
        self.exported = {}       # oid -> [_Entry, weight lent out] owned here, held elsewhere
        self.holders = {}        # peer -> {oid: weight} what it reported holding of ours
        self.relayed_holders = {}   # peer -> owners its HolderWeights were relayed to
        self.borrowed = weakref.WeakValueDictionary()   # oid -> _BorrowedEntry
        self.fetching = {}       # oid -> [entries] borrowed objects being fetched
        self.fetch_requested = set()
        self.pinned_refs = {}    # oid -> ref, in blobs loaded more than once (refs.pinning_refs)
        self._export_lock = threading.Lock()

    def lend(self, ref):
        """The weight to send with ``ref`` (unready) serialised for another process."""
        e = ref._e
        oid = ref._id
        with self._export_lock:
            if ref._owner == self.node.id:
                rec = self.exported.get(oid)
                if rec is None:
                    self.exported[oid] = [e, 1]
                else:
                    rec[1] += 1
                return 1
            w = getattr(e, "weight", 0)
            if not w:
                # Nothing to split (cannot happen for a ref this process
                # received): the receiver will hold no weight.
                return None
            half = fractions.Fraction(w) / 2
            e.weight = w - half
            # The receiver will report it HELD; if this process dies first,
            # the owner must not count it among what it takes back.
            self.node._releases.append(
                (ref._owner, oid, HolderWeight(half, HolderWeight.PASSED_ON)))
            return (half.numerator, half.denominator)

    def lookup_owned(self, oid):
        rec = self.exported.get(oid)
        if rec is not None:
            return rec[0]
        e = self.node.pending.get(oid)
        if type(e) is list:
            e = None
        return e

    def receive_ref(self, oid, owner, weight):
        """The entry for a ref (not ready when sent) that arrived from another process."""
        node = self.node
        if owner == node.id:
            e = self.lookup_owned(oid)
            if weight is not None:
                self._give_back(oid, weight)   # the weight came home
            if e is None:
                e = error_entry(ObjectLostError(
                    f"object {oid:x} is not known to its owner (freed?)", oid))
            return e
        with self._export_lock:
            e = self.borrowed.get(oid)
            if e is None:
                e = _BorrowedEntry(oid, owner, node)
                if owner in node.dead_peers:
                    e.set_error(OwnerDiedError(f"the owner of object {oid:x} died", oid))
                self.borrowed[oid] = e
            if weight is not None:
                if e.ready:
                    self.release_later(owner, oid, weight)
                else:
                    w = weight if type(weight) is int else fractions.Fraction(*weight)
                    e.weight = e.weight + w if e.weight else w
                    # The owner takes it back itself should this process die.
                    node._releases.append((owner, oid, HolderWeight(w, HolderWeight.HELD)))
        return e

    def receive_stored(self, oid, owner, desc, weight):
        """The entry for a stored object (see ``object_store.py``) that arrived from another process.

        Mapped once per process; the weights that arrive add up (kept until
        the entry dies: the owner must keep the name while this process may
        still pass the ref on).
        """
        node = self.node
        if owner == node.id:
            return self.receive_ref(oid, owner, weight)
        with self._export_lock:
            e = self.borrowed.get(oid)
            if type(e) is not _MappedEntry:
                e = map_stored(oid, owner, desc, node)
                if type(e) is not _MappedEntry:
                    if weight is not None:
                        self.release_later(owner, oid, weight)
                    return e
                self.borrowed[oid] = e
            if weight is not None:
                w = weight if type(weight) is int else fractions.Fraction(*weight)
                e.weight = e.weight + w if e.weight else w
                # The owner takes it back itself should this process die.
                node._releases.append((owner, oid, HolderWeight(w, HolderWeight.HELD)))
        return e

    def _on_holder_report(self, oid, num, den, holder, kind):
        """A borrower's ``HolderWeight``: ``holders`` notes what each one
        holds now (received, less what it passed on or gave back)."""
        w = num if den == 1 else fractions.Fraction(num, den)
        with self._export_lock:
            if kind == HolderWeight.HELD:
                if oid in self.exported:
                    held = self.holders.get(holder)
                    if held is None:
                        held = self.holders[holder] = {}
                    held[oid] = held.get(oid, 0) + w
                return
            held = self.holders.get(holder)
            if held is not None:
                left = held.get(oid)
                if left is not None:
                    left -= w
                    if left > 0:
                        held[oid] = left
                    else:
                        del held[oid]
                        if not held:
                            del self.holders[holder]
        if kind == HolderWeight.GIVEN_BACK:
            self._give_back(oid, w)

    def release_dead_holder(self, peer):
        """Take back the weight that the dead process ``peer`` held.

        What it passed on shortly before it died, and had not reported yet,
        cannot be told apart: so a process it passed a stored object to may
        still read it when the count ends, and the segment must not be
        reused or emptied then (``StoredSegment.readers_unknown``)."""
        with self._export_lock:
            held = self.holders.pop(peer, None)
            if held:
                for oid in held:
                    rec = self.exported.get(oid)
                    seg = getattr(rec[0], "_seg", None) if rec is not None else None
                    if seg is not None:
                        seg.readers_unknown = True
        if held:
            for oid, w in held.items():
                self._give_back(oid, w)

    def give_back_borrowed(self):
        """This process is ending, by ``os._exit``, which runs no ``__del__``:
        the shares it holds of other owners' objects go back now, so that
        what it kept (an actor whose handle it held, say) can go.  A reader's
        share of a stored object the driver takes back itself."""
        with self._export_lock:
            entries = [e for e in self.borrowed.values() if type(e) is _BorrowedEntry]
        for e in entries:
            w = e.weight
            if w:
                e.weight = 0
                self.release_later(e.owner, e.oid, HolderWeight(w, HolderWeight.GIVEN_BACK))
        if self.node._releases:
            self.send_releases()

    def release_later(self, owner, oid, weight):
        """Give ``weight`` back to ``owner`` at the next drain (safe from __del__)."""
        self.node._releases.append((owner, oid, weight))

    def _give_back(self, oid, weight):
        if type(weight) is int:
            w = weight
        elif type(weight) is tuple:
            w = fractions.Fraction(*weight)
        else:
            w = weight
        with self._export_lock:
            rec = self.exported.get(oid)
            if rec is not None:
                rec[1] -= w
                if rec[1] <= 0:
                    del self.exported[oid]

    def on_release(self, peer, msg):
        if len(msg) > 2 and msg[2] != self.node.id:
            # Relayed by the driver for a borrower with no link to the owner;
            # the owner hears of that borrower's death from it too.
            owner = msg[2]
            self.node.send(owner, P.release_msg(msg[1]))
            if any(len(item) == 5 for item in msg[1]):
                self.relayed_holders.setdefault(peer, set()).add(owner)
            return
        for item in msg[1]:
            if len(item) == 3:
                oid, num, den = item
                self._give_back(oid, num if den == 1 else fractions.Fraction(num, den))
            elif item[0] == P.HOLDER_DIED:
                self.release_dead_holder(item[1])
            else:
                self._on_holder_report(*item)

    def tell_owners_holder_died(self, peer):
        """The owners whose borrower ``peer`` reported through this process
        (the driver's relay) have no link to it: they learn of its death here,
        after everything it reported (relayed in order before)."""
        node = self.node
        for owner in self.relayed_holders.pop(peer, ()):
            if owner not in node.dead_peers:
                node.send(owner, P.release_msg([(P.HOLDER_DIED, peer)]))

    def send_releases(self):
        """Send the weights given back since the last drain, one batch per owner."""
        node = self.node
        items, node._releases = node._releases, []
        by_owner = {}
        for owner, oid, w in items:
            if type(w) is HolderWeight:
                f = fractions.Fraction(w.weight)
                by_owner.setdefault(owner, []).append(
                    (oid, f.numerator, f.denominator, node.id, w.kind))
                continue
            if type(w) is tuple:
                num, den = w
            else:
                w = fractions.Fraction(w)
                num, den = w.numerator, w.denominator
            by_owner.setdefault(owner, []).append((oid, num, den))
        for owner, batch in by_owner.items():
            if owner == node.id:
                for item in batch:
                    if len(item) == 3 or item[4] == HolderWeight.GIVEN_BACK:
                        self._give_back(item[0], fractions.Fraction(item[1], item[2]))
            elif owner in node.links:
                node.send(owner, P.release_msg(batch))
            elif node.id != 0 and owner not in node.dead_peers:
                # No link to the owner (we never fetched from it): the
                # driver, linked to everyone, passes it on.
                node.send(0, P.release_msg(batch, owner))

    def object_table_size(self):
        """How many objects this process keeps for others or waits for (for tests)."""
        return (len(self.exported) + len(self.node.pending) + len(self.fetching)
                + len(self.borrowed))

    def ensure_fetch(self, ref):
        """Ask the owner of a borrowed, unready ref for its value (once)."""
        e = ref._e
        node = self.node
        if e.ready or ref._owner == node.id:
            return
        oid = ref._id
        if oid in self.fetch_requested:
            return
        lst = self.fetching.setdefault(oid, [])
        if e not in lst:
            lst.append(e)
        self.fetch_requested.add(oid)
        owner = ref._owner
        if not node.connect(owner) or not node.send(owner, P.fetch_msg(oid)):
            self.fail_fetch(oid, OwnerDiedError(f"the owner of object {oid:x} is gone", oid))
            return
        node.inflight.setdefault(owner, {})[oid] = P.FETCH_OBJECT

    def fail_fetch(self, oid, err):
        self.fetch_requested.discard(oid)
        for e in self.fetching.pop(oid, ()):
            if getattr(e, "weight", 0):
                e.weight = 0     # the owner is gone: nobody to give it back to
            e.set_error(err)

    def on_fetch(self, peer, msg):
        oid = msg[1]
        node = self.node
        e = self.lookup_owned(oid)
        if e is None:
            node.send(peer, P.fetched_msg(oid, False, ObjectLostError(
                f"object {oid:x} is not known to its owner (freed?)", oid)))
            return

        def answer(entry, peer=peer, oid=oid):
            if entry.error is None:
                try:
                    link = node.links.get(peer)
                    if link is not None:
                        stored = stored_form(ObjectRef(oid, node.id, entry))
                        # A large value goes as its descriptor: the fetcher maps it.
                        value = entry.value if stored is None else StoredValue(
                            ObjectRef(oid, node.id, entry))
                        link.send(P.fetched_msg(oid, True, value))
                except (LinkClosed, OSError):
                    pass
                except Exception as exc:  # noqa: BLE001 - the value cannot be serialised
                    node.send(peer, P.fetched_msg(oid, False, TypeError(
                        f"could not serialize object {oid:x}: {exc}")))
            else:
                node.send(peer, P.fetched_msg(oid, False, entry.error))
        e.add_callback(answer)

    def on_fetched(self, peer, msg):
        _, oid, ok, payload = msg
        fl = self.node.inflight.get(peer)
        if fl is not None:
            fl.pop(oid, None)
        self.fetch_requested.discard(oid)
        if type(payload) is LoadedValue:
            ok, payload, _ = loaded(ok, payload)
        for e in self.fetching.pop(oid, ()):
            if ok:
                if type(payload) not in _IMMUTABLE and not e.ready:
                    keep_private(e)
                e.set_value(payload)
            else:
                e.set_error(payload)
            if getattr(e, "weight", 0):
                with self._export_lock:
                    w, e.weight = e.weight, 0
                if w:
                    # The value is here: this process never needs the owner for it again.
                    self.release_later(peer, oid, HolderWeight(w, HolderWeight.GIVEN_BACK))
