"""Who leads, read from the leader partition in its order: the pure rules.

Every scheduler instance reads the one-partition ``scheduler-leader`` topic
(no consumer group) and folds its records, in log order, through a
:class:`LeaderLog`. The records are :class:`~schemas.messages.LeaderClaim`
of three kinds:

* **beat**: the leader is alive. It writes one every ``silence / 5``.
* **claim**: a scheduler that heard nothing from the leader for ``silence``
  takes over from epoch ``after`` with a higher ``epoch``. A claim is
  *valid* when ``after`` is the epoch in force at its place in the log:
  of two claims racing for the same succession, the first written wins,
  and every reader of the log sees the same winner (the log orders them;
  no clock decides). A claimant reads the log back to its own claim to
  learn whether it won.
* **resign**: the leader stopped cleanly; a standby claims at once.

Reading from the middle of the log (a new instance reads only the recent
records) starts with no leader known: the first beat or claim read sets
it; after that a beat of a higher epoch than the one in force is adopted
(a beat is written only by a claimant that read its own claim as valid, so
a higher epoch that beats won a succession this reader did not see), and
one of a lower epoch is a deposed leader's, ignored.

Time is passed in (``now_s``, a monotonic clock of this instance): silence
is measured from when this reader *read* the leader's last record, never by
comparing clocks across machines. The lease that keeps a slow leader from
dispatching beside its successor is :class:`Lease`: a leader may dispatch
only within a share of ``silence`` (0.7, :mod:`scheduler.leader`) of
*sending* a beat it has since read back as valid; its successor claims only ``silence`` after *reading* its last beat,
which came after the send, so the old lease ends first as long as the two
clocks run at about the same rate.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from schemas.messages import LeaderClaim

__all__ = ["Leader", "LeaderLog", "Lease", "next_epoch"]

#: Leaders remembered by epoch (a successor looks up its predecessor's beats).
_REMEMBERED = 16


def next_epoch(now_ms: int, highest_claimed: int, own_last: int = 0) -> int:
    """A new leader's epoch: above every epoch seen and our own last, at least the clock."""
    return max(now_ms, highest_claimed + 1, own_last + 1)


@dataclass(frozen=True)
class Leader:
    """One leadership as the log tells it (fixed but for what its beats update)."""

    epoch: int
    instance: str
    #: The epoch it took over from (0: none, or not known).
    after: int = 0
    #: From its latest beat (see LeaderClaim.floor_ms, .fenced_ms).
    floor_ms: int | None = None
    fenced_ms: int | None = None
    resigned: bool = False


class LeaderLog:
    """The fold of the leader partition, for one reader.

    Mutable only through :meth:`apply` (records in log order) and
    :meth:`start` (the reader's clock starts).
    """

    def __init__(self, silence_s: float):
        if silence_s <= 0:
            raise ValueError(f"silence_s must be positive, got {silence_s}")
        self.silence_s = silence_s
        #: The leader in force, None while none is known.
        self.current: Leader | None = None
        #: The highest epoch in any record read (the next claim goes higher).
        self.highest = 0
        #: Recent leaders by epoch, oldest first.
        self.leaders: dict[int, Leader] = {}
        self._heard_s: float | None = None
        self._started_s: float | None = None

    def start(self, now_s: float) -> None:
        """The reader starts (or starts over): silence counts from here while none is known."""
        self._started_s = now_s

    # -- reading -----------------------------------------------------------------

    def apply(self, rec: LeaderClaim, now_s: float) -> str:
        """Fold one record; returns what it was: ``claim_won``, ``claim_lost``, ``beat``,
        ``beat_stale``, ``resigned`` or ``ignored``."""
        self.highest = max(self.highest, rec.epoch)
        cur = self.current
        if rec.kind == "claim":
            if cur is None or (rec.after == cur.epoch and rec.epoch > cur.epoch):
                self._lead(Leader(rec.epoch, rec.instance, after=rec.after), now_s)
                return "claim_won"
            return "claim_lost"
        if rec.kind == "beat":
            if cur is None or rec.epoch > cur.epoch:
                self._lead(Leader(rec.epoch, rec.instance, after=rec.after,
                                  floor_ms=rec.floor_ms, fenced_ms=rec.fenced_ms), now_s)
                return "beat"
            if rec.epoch == cur.epoch and rec.instance == cur.instance:
                self._lead(replace(cur, floor_ms=rec.floor_ms, fenced_ms=rec.fenced_ms,
                                   resigned=False), now_s)
                return "beat"
            return "beat_stale"
        if cur is not None and rec.epoch == cur.epoch and rec.instance == cur.instance:
            self._lead(replace(cur, resigned=True), now_s)
            return "resigned"
        return "ignored"

    def _lead(self, leader: Leader, now_s: float) -> None:
        self.current = leader
        self._heard_s = now_s
        self.leaders[leader.epoch] = leader
        while len(self.leaders) > _REMEMBERED:
            del self.leaders[next(iter(self.leaders))]

    # -- deciding ----------------------------------------------------------------

    def silent(self, now_s: float) -> bool:
        """True when a standby may claim: the leader resigned, or was not heard for ``silence``
        (none known: ``silence`` since :meth:`start`)."""
        cur = self.current
        if cur is not None and cur.resigned:
            return True
        since = self._heard_s if cur is not None else self._started_s
        return since is not None and now_s - since >= self.silence_s

    def heard_s(self) -> float | None:
        """When the leader in force was last read (this reader's clock), None if none is."""
        return self._heard_s if self.current is not None else None

    def claim(self, instance: str, now_ms: int, own_last: int = 0) -> LeaderClaim:
        """The claim this reader would write now: after the epoch in force, above all seen."""
        after = self.current.epoch if self.current is not None else self.highest
        return LeaderClaim(instance=instance, kind="claim", after=after, sent_ms=now_ms,
                           epoch=next_epoch(now_ms, self.highest, own_last))

    def leads(self, instance: str, epoch: int) -> bool:
        """True while ``instance`` with ``epoch`` is the leader in force."""
        cur = self.current
        return cur is not None and cur.epoch == epoch and cur.instance == instance

    def predecessor(self, epoch: int) -> Leader | None:
        """The leader that ``epoch`` took over from, if this reader saw it."""
        me = self.leaders.get(epoch)
        return self.leaders.get(me.after) if me is not None and me.after else None

    def chain(self, epoch: int) -> list[int]:
        """Epochs before ``epoch``, newest first, as far as the claims read tell."""
        out: list[int] = []
        me = self.leaders.get(epoch)
        after = me.after if me is not None else 0
        while after and after not in out and len(out) < _REMEMBERED:
            out.append(after)
            prev = self.leaders.get(after)
            after = prev.after if prev is not None else 0
        return out


class Lease:
    """How long a leader may dispatch: ``length_s`` after sending a beat later read back
    as valid (monotonic seconds passed in)."""

    def __init__(self, length_s: float):
        self.length_s = length_s
        self._until_s = float("-inf")

    def confirmed(self, sent_s: float) -> None:
        """A beat sent at ``sent_s`` was read back with this leader still in force."""
        self._until_s = max(self._until_s, sent_s + self.length_s)

    def valid(self, now_s: float) -> bool:
        return now_s < self._until_s

    def end(self) -> None:
        self._until_s = float("-inf")
