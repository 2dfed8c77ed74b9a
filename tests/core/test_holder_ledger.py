"""The owner's ledger of what each borrower holds (``Objects.holders``),
driven by the borrowers' ``HolderWeight`` reports, and what a borrower's
death takes back.  No processes: the reports are fed in as they arrive."""
from fractions import Fraction

import pytest

from ray_lite._private.links import protocol as P
from ray_lite._private.objects.entries import HolderWeight, _Entry
from ray_lite._private.objects.ownership import Objects

HELD, PASSED_ON, GIVEN_BACK = HolderWeight.HELD, HolderWeight.PASSED_ON, HolderWeight.GIVEN_BACK
OID = 7


class Owner(Objects):
    """The objects part standing in for its node too (``id``, ``send``)."""

    def __init__(self):
        super().__init__(self)
        self.id = 0
        self.dead_peers = {}
        self.sent = []

    def lend_out(self, count):
        self.exported[OID] = [_Entry(), count]

    def report(self, holder, kind, w):
        w = Fraction(w)
        self.on_release(holder, (P.RELEASE, [(OID, w.numerator, w.denominator, holder, kind)]))

    def count(self):
        rec = self.exported.get(OID)
        return None if rec is None else rec[1]

    def send(self, peer, msg):
        self.sent.append((peer, msg))
        return True


def test_a_dead_borrower_gives_back_what_it_held():
    o = Owner()
    o.lend_out(2)
    o.report(1, HELD, 1)
    o.report(2, HELD, 1)
    o.release_dead_holder(1)
    assert o.count() == 1 and 1 not in o.holders
    o.release_dead_holder(2)
    assert o.count() is None and not o.holders


def test_what_it_passed_on_stays_lent_to_the_receiver():
    o = Owner()
    o.lend_out(1)
    o.report(1, HELD, 1)
    o.report(1, PASSED_ON, Fraction(1, 2))
    o.report(2, HELD, Fraction(1, 2))
    o.release_dead_holder(1)
    assert o.count() == Fraction(1, 2)
    assert o.holders == {2: {OID: Fraction(1, 2)}}
    o.report(2, GIVEN_BACK, Fraction(1, 2))
    assert o.count() is None and not o.holders


@pytest.mark.parametrize("order", ["receiver first", "passer first"])
def test_the_two_reports_of_a_hand_over_may_come_in_either_order(order):
    o = Owner()
    o.lend_out(1)
    o.report(1, HELD, 1)
    reports = [(2, HELD, Fraction(1, 2)), (1, PASSED_ON, Fraction(1, 2))]
    for r in (reports if order == "receiver first" else reversed(reports)):
        o.report(*r)
    assert o.holders == {1: {OID: Fraction(1, 2)}, 2: {OID: Fraction(1, 2)}}
    assert o.count() == 1           # a hand-over moves a share, gives nothing back


def test_a_borrower_that_gave_everything_back_is_forgotten():
    o = Owner()
    o.lend_out(3)
    o.report(1, HELD, 1)
    o.report(1, HELD, 1)            # the ref came to it twice: the shares add up
    o.report(1, GIVEN_BACK, 2)
    assert not o.holders and o.count() == 1
    o.release_dead_holder(1)        # nothing left to take back
    assert o.count() == 1


def test_a_report_of_an_object_no_longer_lent_is_not_kept():
    o = Owner()
    o.report(1, HELD, 1)
    assert not o.holders


def test_the_driver_relays_reports_and_then_the_death():
    driver = Owner()
    batch = [(OID, 1, 1, 5, HELD)]
    driver.on_release(5, (P.RELEASE, batch, 3))        # borrower 5, owner 3
    assert driver.sent == [(3, (P.RELEASE, batch))]
    driver.tell_owners_holder_died(5)
    assert driver.sent[-1] == (3, (P.RELEASE, [(P.HOLDER_DIED, 5)]))
    assert not driver.relayed_holders
    # The owner, told so, takes back what the borrower held.
    owner = Owner()
    owner.lend_out(1)
    owner.on_release(0, driver.sent[0][1])
    owner.on_release(0, driver.sent[1][1])
    assert owner.count() is None and not owner.holders
