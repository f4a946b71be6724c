"""Tornado's two-phase protocol (skpub.balancer.protocol): exactly-once delivery and exact top-k at every step."""

from collections import Counter

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from skpub.balancer.protocol import Obj, Phase, ProtocolError, Sub, TwoPhase, Unsub
from tests.profiles import examples

CELLS, EVALUATORS, UNITS, KEYWORDS = 6, 3, 3, ("a", "b", "c")


class Protocol(RuleBasedStateMachine):
    """Random arrivals at random routing units, interleaved with every protocol step, against a plain replay."""

    def __init__(self):
        super().__init__()
        self.system = TwoPhase({c: c % EVALUATORS for c in range(CELLS)}, EVALUATORS, UNITS)
        self.active: dict[tuple[int, int], str] = {}
        self.objects: list[Obj] = []
        self.expected: Counter = Counter()
        self.next_id = 0

    def _id(self):
        self.next_id += 1
        return self.next_id

    @rule(unit=st.integers(0, UNITS - 1), cell=st.integers(0, CELLS - 1), keyword=st.sampled_from(KEYWORDS))
    def subscribe(self, unit, cell, keyword):
        sid = self._id()
        self.system.route(unit, Sub(sid, cell, keyword))
        self.active[(sid, cell)] = keyword

    @precondition(lambda self: self.active)
    @rule(unit=st.integers(0, UNITS - 1), data=st.data())
    def unsubscribe(self, unit, data):
        sid, cell = data.draw(st.sampled_from(sorted(self.active)))
        self.system.route(unit, Unsub(sid, cell))
        del self.active[(sid, cell)]

    @rule(
        unit=st.integers(0, UNITS - 1),
        cell=st.integers(0, CELLS - 1),
        terms=st.frozensets(st.sampled_from(KEYWORDS), min_size=1),
        score=st.integers(0, 5),
    )
    def publish_object(self, unit, cell, terms, score):
        obj = Obj(self._id(), cell, terms, float(score))
        self.system.route(unit, obj)
        self.objects.append(obj)
        for (sid, c), keyword in self.active.items():
            if c == cell and keyword in terms:
                self.expected[(sid, obj.id)] += 1

    @precondition(lambda self: self.system.transfer is None)
    @rule(data=st.data())
    def begin(self, data):
        latest = self.system.epochs[-1]
        source = data.draw(st.sampled_from(sorted(set(latest.values()))))
        mine = sorted(c for c, e in latest.items() if e == source)
        cells = data.draw(st.sets(st.sampled_from(mine), min_size=1))
        target = data.draw(st.sampled_from([e for e in range(EVALUATORS) if e != source]))
        self.system.begin(cells, target)

    @precondition(lambda self: self.system.transfer is not None and self.system.transfer.phase is Phase.TRANSFER)
    @rule()
    def acknowledge(self):
        self.system.acknowledge()

    @precondition(
        lambda self: (
            self.system.transfer is not None
            and self.system.transfer.phase is Phase.UPDATE
            and not self.system.transfer.published
        )
    )
    @rule()
    def publish(self):
        self.system.publish()

    @rule(unit=st.integers(0, UNITS - 1))
    def switch(self, unit):
        self.system.switch(unit)

    @precondition(lambda self: self.system.transfer is not None and self.system.transfer.published)
    @rule()
    def finish(self):
        if all(v == len(self.system.epochs) - 1 for v in self.system.views):
            self.system.finish()
        else:
            with pytest.raises(ProtocolError):
                self.system.finish()

    @invariant()
    def every_match_delivered_exactly_once(self):
        assert Counter(self.system.deliveries) == self.expected

    @invariant()
    def ranked_results_equal_the_replay(self):
        for keyword in KEYWORDS:
            ranked = sorted((o for o in self.objects if keyword in o.terms), key=lambda o: (-o.score, o.id))
            assert self.system.topk(keyword, 3) == [o.id for o in ranked[:3]]

    @invariant()
    def every_cell_has_one_owner(self):
        owned = [c for ev in self.system.evaluators for c in ev.owned]
        assert sorted(owned) == list(range(CELLS))


TestProtocol = Protocol.TestCase
TestProtocol.settings = examples(3, stateful_step_count=60)


def test_steps_out_of_order_are_refused():
    system = TwoPhase({0: 0, 1: 1}, 2, 2)
    with pytest.raises(ProtocolError):
        system.acknowledge()
    system.begin({0}, 1)
    with pytest.raises(ProtocolError):
        system.begin({1}, 0)
    with pytest.raises(ProtocolError):
        system.publish()
    system.acknowledge()
    system.publish()
    system.switch(0)
    with pytest.raises(ProtocolError):
        system.finish()
    system.switch(1)
    system.finish()
    assert system.evaluators[0].owned == set() and system.evaluators[1].owned == {0, 1}


def test_the_source_forwards_after_the_acknowledgement():
    """A straggler routed by the old epoch after the target took over is processed at the target, not the source."""
    system = TwoPhase({0: 0, 1: 1}, 2, 2)
    system.route(0, Sub(1, 0, "a"))
    system.begin({0}, 1)
    system.route(0, Sub(2, 0, "b"))
    system.acknowledge()
    system.publish()
    system.switch(1)
    system.route(0, Obj(3, 0, frozenset({"a", "b"}), 1.0))
    assert sorted(system.deliveries) == [(1, 3), (2, 3)]
    assert system.evaluators[0].window.get(0, []) == []
    assert [o.id for o in system.evaluators[1].window[0]] == [3]
