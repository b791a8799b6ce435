"""A batch's lines that share a prompt prefix, keyed as they stream into the insert (contract/prefix.py).

Only shared keys are stored: the claim runs a batch's keyed lines by key, then the rest in input order
(worker/fair.py), so a key that no other line has would only move its line out of input order. A line
gets its key when an earlier line had it; the first line of each shared key gets it after the insert
(one UPDATE per shared key, in the same transaction).
"""

from dataclasses import dataclass, field

from sqlalchemy import bindparam, update
from sqlalchemy.orm import Session

from api.prompts.encoder import job_prefix_key
from core.models import Job
from core.settings import Settings


@dataclass
class SharedPrefixes:
    settings: Settings
    _first: dict[int, str] = field(default_factory=dict)  # key -> the job id of its first line
    _shared: set[int] = field(default_factory=set)

    def key(self, job_id: str, token_ids: list[int]) -> int | None:
        """The line's key if an earlier line of the batch has it (the first one's is written later)."""
        key = job_prefix_key(self.settings, token_ids)
        if key is None:
            return None
        if self._first.setdefault(key, job_id) == job_id:
            return None
        self._shared.add(key)
        return key

    def key_first_lines(self, session: Session) -> None:
        if not self._shared:
            return
        table = Job.__table__
        statement = update(table).where(table.c.id == bindparam("first")).values(prefix_key=bindparam("key"))
        session.execute(statement, [{"first": self._first[key], "key": key} for key in self._shared])
