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
"""
from ray_lite._lazy import lazy_module
from ray_lite.exceptions import ObjectLostError, OwnerDiedError

from ..links import protocol as P
from ..links.transport import LinkClosed
from .entries import HolderWeight
from .refs import (LoadedValue, ObjectRef, StoredValue, _BorrowedEntry, _MappedEntry,
                   adopt_stored, error_entry, loaded, map_stored,
                   stored_form)

# Weights are fractions once a borrower passes a ref on; fractions imports
# decimal, which a process that never does is spared.
fractions = lazy_module("fractions", globals())


class ObjectsMixin:
    """Results expected, objects lent and borrowed (part of ``Node``)."""

    def expect(self, peer, oid, entry, kind):
        """Record that ``peer`` will answer ``oid`` (for failure on its death)."""
        self.pending[oid] = entry
        self.inflight.setdefault(peer, {})[oid] = kind

    def _on_result(self, peer, msg):
        _, oid, ok, payload = msg
        if not ok and self.exc_retries and self.retry_on_exception(oid, payload):
            return      # sent again (retry_exceptions of an actor's method)
        mapped = None
        if type(payload) is LoadedValue:
            ok, payload, mapped = loaded(ok, payload)
        fl = self.inflight.get(peer)
        if fl is not None:
            fl.pop(oid, None)
        target = self.pending.pop(oid, None)
        if target is None:
            return
        if mapped is not None:
            adopt_stored(target, mapped)
        if type(target) is list:
            if ok:
                for e, v in zip(target, payload):
                    if type(v) is P.FailedReturn:     # a generator stopped early
                        e.set_error(v.error)
                    else:
                        e.set_value(v)
            else:
                for e in target:
                    e.set_error(payload)
        elif ok:
            # target.set_value(payload), inline: every call's result comes here.
            if not target.ready:
                target.value = payload
                target.ready = True
                if target.callbacks:
                    target._fire()
        else:
            target.set_error(payload)

    def lend(self, ref):
        """The weight to send with ``ref`` (unready) serialised for another process."""
        e = ref._e
        oid = ref._id
        with self._export_lock:
            if ref._owner == self.id:
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
            self._releases.append((ref._owner, oid, HolderWeight(half, HolderWeight.PASSED_ON)))
            return (half.numerator, half.denominator)

    def lookup_owned(self, oid):
        rec = self.exported.get(oid)
        if rec is not None:
            return rec[0]
        e = self.pending.get(oid)
        if type(e) is list:
            e = None
        return e

    def receive_ref(self, oid, owner, weight):
        """The entry for a ref (not ready when sent) that arrived from another process."""
        if owner == self.id:
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
                e = _BorrowedEntry(oid, owner, self)
                if owner in self.dead_peers:
                    e.set_error(OwnerDiedError(f"the owner of object {oid:x} died", oid))
                self.borrowed[oid] = e
            if weight is not None:
                if e.ready:
                    self.release_later(owner, oid, weight)
                else:
                    w = weight if type(weight) is int else fractions.Fraction(*weight)
                    e.weight = e.weight + w if e.weight else w
                    # The owner takes it back itself should this process die.
                    self._releases.append((owner, oid, HolderWeight(w, HolderWeight.HELD)))
        return e

    def receive_stored(self, oid, owner, desc, weight):
        """The entry for a stored object (see ``object_store.py``) that arrived from another process.

        Mapped once per process; the weights that arrive add up (kept until
        the entry dies: the owner must keep the name while this process may
        still pass the ref on).
        """
        if owner == self.id:
            return self.receive_ref(oid, owner, weight)
        with self._export_lock:
            e = self.borrowed.get(oid)
            if type(e) is not _MappedEntry:
                e = map_stored(oid, owner, desc, self)
                if type(e) is not _MappedEntry:
                    if weight is not None:
                        self.release_later(owner, oid, weight)
                    return e
                self.borrowed[oid] = e
            if weight is not None:
                w = weight if type(weight) is int else fractions.Fraction(*weight)
                e.weight = e.weight + w if e.weight else w
                # The owner takes it back itself should this process die.
                self._releases.append((owner, oid, HolderWeight(w, HolderWeight.HELD)))
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
        if self._releases:
            self._send_releases()

    def release_later(self, owner, oid, weight):
        """Give ``weight`` back to ``owner`` at the next drain (safe from __del__)."""
        self._releases.append((owner, oid, weight))

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

    def _on_release(self, peer, msg):
        if len(msg) > 2 and msg[2] != self.id:
            # Relayed by the driver for a borrower with no link to the owner;
            # the owner hears of that borrower's death from it too.
            owner = msg[2]
            self.send(owner, P.release_msg(msg[1]))
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
        for owner in self.relayed_holders.pop(peer, ()):
            if owner not in self.dead_peers:
                self.send(owner, P.release_msg([(P.HOLDER_DIED, peer)]))

    def _send_releases(self):
        items, self._releases = self._releases, []
        by_owner = {}
        for owner, oid, w in items:
            if type(w) is HolderWeight:
                f = fractions.Fraction(w.weight)
                by_owner.setdefault(owner, []).append(
                    (oid, f.numerator, f.denominator, self.id, w.kind))
                continue
            if type(w) is tuple:
                num, den = w
            else:
                w = fractions.Fraction(w)
                num, den = w.numerator, w.denominator
            by_owner.setdefault(owner, []).append((oid, num, den))
        for owner, batch in by_owner.items():
            if owner == self.id:
                for item in batch:
                    if len(item) == 3 or item[4] == HolderWeight.GIVEN_BACK:
                        self._give_back(item[0], fractions.Fraction(item[1], item[2]))
            elif owner in self.links:
                self.send(owner, P.release_msg(batch))
            elif self.id != 0 and owner not in self.dead_peers:
                # No link to the owner (we never fetched from it): the
                # driver, linked to everyone, passes it on.
                self.send(0, P.release_msg(batch, owner))

    def object_table_size(self):
        """How many objects this process keeps for others or waits for (for tests)."""
        return len(self.exported) + len(self.pending) + len(self.fetching) + len(self.borrowed)

    def ensure_fetch(self, ref):
        """Ask the owner of a borrowed, unready ref for its value (once)."""
        e = ref._e
        if e.ready or ref._owner == self.id:
            return
        oid = ref._id
        if oid in self.fetch_requested:
            return
        lst = self.fetching.setdefault(oid, [])
        if e not in lst:
            lst.append(e)
        self.fetch_requested.add(oid)
        owner = ref._owner
        if not self.connect(owner) or not self.send(owner, P.fetch_msg(oid)):
            self._fail_fetch(oid, OwnerDiedError(f"the owner of object {oid:x} is gone", oid))
            return
        self.inflight.setdefault(owner, {})[oid] = P.FETCH_OBJECT

    def _fail_fetch(self, oid, err):
        self.fetch_requested.discard(oid)
        for e in self.fetching.pop(oid, ()):
            if getattr(e, "weight", 0):
                e.weight = 0     # the owner is gone: nobody to give it back to
            e.set_error(err)

    def _on_fetch(self, peer, msg):
        oid = msg[1]
        e = self.lookup_owned(oid)
        if e is None:
            self.send(peer, P.fetched_msg(oid, False, ObjectLostError(
                f"object {oid:x} is not known to its owner (freed?)", oid)))
            return

        def answer(entry, peer=peer, oid=oid):
            if entry.error is None:
                try:
                    link = self.links.get(peer)
                    if link is not None:
                        stored = stored_form(ObjectRef(oid, self.id, entry))
                        # A large value goes as its descriptor: the fetcher maps it.
                        value = entry.value if stored is None else StoredValue(
                            ObjectRef(oid, self.id, entry))
                        link.send(P.fetched_msg(oid, True, value))
                except (LinkClosed, OSError):
                    pass
                except Exception as exc:  # noqa: BLE001 - the value cannot be serialised
                    self.send(peer, P.fetched_msg(oid, False, TypeError(
                        f"could not serialize object {oid:x}: {exc}")))
            else:
                self.send(peer, P.fetched_msg(oid, False, entry.error))
        e.add_callback(answer)

    def _on_fetched(self, peer, msg):
        _, oid, ok, payload = msg
        fl = self.inflight.get(peer)
        if fl is not None:
            fl.pop(oid, None)
        self.fetch_requested.discard(oid)
        if type(payload) is LoadedValue:
            ok, payload, _ = loaded(ok, payload)
        for e in self.fetching.pop(oid, ()):
            if ok:
                e.set_value(payload)
            else:
                e.set_error(payload)
            if getattr(e, "weight", 0):
                with self._export_lock:
                    w, e.weight = e.weight, 0
                if w:
                    # The value is here: this process never needs the owner for it again.
                    self.release_later(peer, oid, HolderWeight(w, HolderWeight.GIVEN_BACK))
