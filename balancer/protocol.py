"""Tornado's two-phase protocol for moving cells between evaluators, as a pure state machine (Tornado 4.4).

Several routing units route records by their own view of the routing epoch;
evaluators hold per-cell state (range subscriptions, window objects); one
transfer moves a set of cells from a source to a target evaluator:

1. *Cell transfer* (:meth:`TwoPhase.begin`): every routing unit still routes
   by epoch n. The source puts a copy of the cells' state in a FIFO
   channel to the target and keeps processing the cells: an object there is
   matched at the source and its window record follows the copy in the
   channel; a subscription or unsubscription there is applied at the source
   and forwarded through the channel.
2. *Routing update* (:meth:`TwoPhase.acknowledge`, :meth:`TwoPhase.publish`,
   :meth:`TwoPhase.switch`): the target applies the channel in order and
   acknowledges; from then on it owns the cells and the source forwards,
   never processes, whatever still reaches it for them. Epoch n+1 is then
   published and routing units switch one at a time, in any order. When all
   have switched, :meth:`TwoPhase.finish` drops the cells at the source.

Delivery is synchronous here (a record sent is received at once) except the
channel, which the target applies when it acknowledges; the hypothesis
stateful tests interleave arrivals at every routing unit with every step.
The engines realize the same rules over micro-batches (DESIGN "The balancer":
transfer during batch b+1, routing by epoch n+1 from b+2).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum


@dataclass(frozen=True)
class Obj:
    """An object at ``cell`` with ``terms`` and a ranking ``score``."""

    id: int
    cell: int
    terms: frozenset[str]
    score: float


@dataclass(frozen=True)
class Sub:
    """A range subscription's part in one ``cell``, matching objects that hold ``keyword``."""

    id: int
    cell: int
    keyword: str


@dataclass(frozen=True)
class Unsub:
    """The end of subscription ``id``'s part in ``cell``."""

    id: int
    cell: int


Message = Obj | Sub | Unsub


@dataclass
class Evaluator:
    """One evaluator's cells: their subscriptions and window objects, and the cells it owns for results."""

    subs: dict[int, dict[int, str]] = field(default_factory=dict)
    window: dict[int, list[Obj]] = field(default_factory=dict)
    owned: set[int] = field(default_factory=set)


class Phase(Enum):
    """Where the current transfer is."""

    TRANSFER = "transfer"
    UPDATE = "update"


@dataclass(frozen=True)
class CellCopy:
    """The state of the moved cells at the source when the transfer begins: subscriptions and window objects."""

    subs: dict[int, dict[int, str]]
    window: dict[int, list[Obj]]


@dataclass
class Transfer:
    """Cells ``cells`` moving from ``source`` to ``target`` (a move); ``channel`` is the FIFO source -> target.

    The channel holds the cells' copy, then the subscriptions, unsubscriptions
    and window objects the source forwarded during the transfer phase.
    """

    cells: frozenset[int]
    source: int
    target: int
    phase: Phase = Phase.TRANSFER
    channel: list[CellCopy | Message] = field(default_factory=list)
    published: bool = False


class ProtocolError(RuntimeError):
    """A protocol step was taken out of order (a bug in the caller)."""


class TwoPhase:
    """Routing units, evaluators and at most one transfer, following Tornado's rules.

    Parameters
    ----------
    owner : dict of int to int
        Cell -> evaluator of epoch 0.
    evaluators : int
    units : int
        Number of routing units.
    """

    def __init__(self, owner: dict[int, int], evaluators: int, units: int) -> None:
        self.epochs = [dict(owner)]
        self.views = [0] * units
        self.evaluators = [Evaluator() for _ in range(evaluators)]
        for cell, e in owner.items():
            self.evaluators[e].owned.add(cell)
        self.transfer: Transfer | None = None
        self.deliveries: list[tuple[int, int]] = []

    # -- routing ---------------------------------------------------------------

    def route(self, unit: int, message: Message) -> None:
        """Send ``message`` from routing unit ``unit`` to the owner of its cell in that unit's epoch view."""
        self.receive(self.epochs[self.views[unit]][message.cell], message)

    def receive(self, e: int, message: Message) -> None:
        """Deliver ``message`` to evaluator ``e``, applying Tornado 4.4's rules at a source of moved cells."""
        m = self.transfer
        if m is not None and e == m.source and message.cell in m.cells:
            if m.phase is Phase.TRANSFER:
                self._process(e, message)
                m.channel.append(message)
                return
            self._process(m.target, message)
            return
        if message.cell not in self.evaluators[e].owned:
            raise ProtocolError(f"evaluator {e} got a record for cell {message.cell} it neither owns nor moves")
        self._process(e, message)

    def _process(self, e: int, message: Message) -> None:
        ev = self.evaluators[e]
        if isinstance(message, Sub):
            ev.subs.setdefault(message.cell, {})[message.id] = message.keyword
        elif isinstance(message, Unsub):
            ev.subs.get(message.cell, {}).pop(message.id, None)
        else:
            for sid, keyword in sorted(ev.subs.get(message.cell, {}).items()):
                if keyword in message.terms:
                    self.deliveries.append((sid, message.id))
            ev.window.setdefault(message.cell, []).append(message)

    # -- the protocol ----------------------------------------------------------

    def begin(self, cells: set[int], target: int) -> None:
        """Start moving ``cells`` (all owned by one evaluator in the latest epoch) to ``target``: the transfer phase.

        Raises
        ------
        ProtocolError
            If a transfer is under way, or the cells are not one evaluator's.
        """
        if self.transfer is not None:
            raise ProtocolError("one transfer at a time")
        latest = self.epochs[-1]
        sources = {latest[c] for c in cells}
        if len(sources) != 1 or target in sources:
            raise ProtocolError(f"cells {sorted(cells)} are not one evaluator's, or already the target's")
        source = sources.pop()
        src = self.evaluators[source]
        copy = CellCopy(
            {c: dict(src.subs.get(c, {})) for c in cells},
            {c: list(src.window.get(c, [])) for c in cells},
        )
        self.transfer = Transfer(frozenset(cells), source, target, channel=[copy])

    def acknowledge(self) -> None:
        """Apply the channel at the target, which owns the cells from now on: the routing update phase."""
        m = self._expect(Phase.TRANSFER)
        tgt = self.evaluators[m.target]
        for item in m.channel:
            if isinstance(item, CellCopy):
                for c in m.cells:
                    tgt.subs[c] = dict(item.subs[c])
                    tgt.window[c] = list(item.window[c])
            elif isinstance(item, Obj):
                tgt.window.setdefault(item.cell, []).append(item)
            elif isinstance(item, Sub):
                tgt.subs.setdefault(item.cell, {})[item.id] = item.keyword
            else:
                tgt.subs.get(item.cell, {}).pop(item.id, None)
        m.channel.clear()
        self.evaluators[m.source].owned -= m.cells
        tgt.owned |= m.cells
        m.phase = Phase.UPDATE

    def publish(self) -> None:
        """Publish the epoch in which the target owns the cells (after the acknowledgement)."""
        m = self._expect(Phase.UPDATE)
        if m.published:
            raise ProtocolError("the epoch of this transfer is already published")
        table = dict(self.epochs[-1])
        table.update(dict.fromkeys(m.cells, m.target))
        self.epochs.append(table)
        m.published = True

    def switch(self, unit: int) -> None:
        """Routing unit ``unit`` starts routing by the latest published epoch."""
        self.views[unit] = len(self.epochs) - 1

    def finish(self) -> None:
        """Every routing unit is on the new epoch: the source drops the cells' state.

        Raises
        ------
        ProtocolError
            If the epoch is not published or a routing unit has not switched.
        """
        m = self._expect(Phase.UPDATE)
        if not m.published or any(v != len(self.epochs) - 1 for v in self.views):
            raise ProtocolError("a routing unit still routes by the old epoch")
        src = self.evaluators[m.source]
        for c in m.cells:
            src.subs.pop(c, None)
            src.window.pop(c, None)
        self.transfer = None

    def _expect(self, phase: Phase) -> Transfer:
        if self.transfer is None or self.transfer.phase is not phase:
            raise ProtocolError(f"no transfer in the {phase.value} phase")
        return self.transfer

    # -- results ---------------------------------------------------------------

    def topk(self, keyword: str, k: int) -> list[int]:
        """Return the global top-k object ids holding ``keyword`` (score, then id) from the evaluators' owned cells.

        Each evaluator contributes only the window objects of the cells it
        owns, so an object held by both source and target during a transfer
        counts once.
        """
        found = [o for ev in self.evaluators for c in ev.owned for o in ev.window.get(c, ()) if keyword in o.terms]
        found.sort(key=lambda o: (-o.score, o.id))
        return [o.id for o in found[:k]]
