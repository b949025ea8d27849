"""Topic names, all under one configurable prefix.

=====================  ==========================================  =========
topic                  what it carries                             key
=====================  ==========================================  =========
``requests``           ingress: :class:`Request` from upstream     org
``requests.<tier>``    :class:`AdmittedRequest`, one per tier      org
``backlog``            ingress records a bursting org sent past    -
                       admission's read-ahead, several to a
                       record (``producer/backlog.py``); its
                       partition is their ingress partition
``batches.<endpoint>`` :class:`Batch`, partition = a worker's      batch id
``results``            :class:`Result` when no ``reply_to``        request id
``worker-events``      :class:`WorkerEvent`                        worker
``scheduler-state``    :class:`SchedulerState` for the throttle    -
``scheduler-leader``   :class:`LeaderClaim`, one partition: its    instance
                       owner in group ``scheduler-leader`` leads
``dead-letters``       :class:`DeadLetter`                         -
``replies.*``          results for senders that named a reply topic
=====================  ==========================================  =========
"""

from __future__ import annotations

from dataclasses import dataclass

from schemas.config import Config

__all__ = ["Topics"]


@dataclass(frozen=True)
class Topics:
    """Every topic name of one deployment, derived from its prefix."""

    prefix: str = "sf."

    @classmethod
    def of(cls, config: Config) -> Topics:
        return cls(config.service.topic_prefix)

    @property
    def ingress(self) -> str:
        return f"{self.prefix}requests"

    @property
    def backlog(self) -> str:
        """Admission's: a bursting org's excess, partition for partition with ingress."""
        return f"{self.prefix}backlog"

    def tier(self, tier: str) -> str:
        return f"{self.prefix}requests.{tier}"

    def batches(self, endpoint: str) -> str:
        return f"{self.prefix}batches.{endpoint}"

    @property
    def results(self) -> str:
        return f"{self.prefix}results"

    @property
    def worker_events(self) -> str:
        return f"{self.prefix}worker-events"

    @property
    def scheduler_state(self) -> str:
        return f"{self.prefix}scheduler-state"

    @property
    def scheduler_leader(self) -> str:
        """One partition; the scheduler its group assigns it to is the active one."""
        return f"{self.prefix}scheduler-leader"

    @property
    def dead_letters(self) -> str:
        return f"{self.prefix}dead-letters"

    def reply_prefix(self, config: Config) -> str:
        return f"{self.prefix}{config.service.reply_prefix}"

    def all(self, config: Config) -> dict[str, int]:
        """Every topic the pipeline needs, with its partition count."""
        s = config.service
        specs = {
            self.ingress: s.ingress_partitions,
            self.backlog: s.ingress_partitions,
            self.results: s.results_partitions,
            self.worker_events: 1,
            self.scheduler_state: 1,
            self.scheduler_leader: 1,
            self.dead_letters: 1,
        }
        for t in config.tier_names:
            specs[self.tier(t)] = s.tier_partitions
        for name, ep in config.endpoints.items():
            specs[self.batches(name)] = ep.partitions
        return specs
