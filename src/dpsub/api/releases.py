"""Which releases a session's ledger charges, so that loading a state never lowers it.

A :class:`~dpsub.api.private.PrivateTraining` session gives each release it makes a random
id and keeps, for every release its ledger charges (its own and those that came with
loaded states), what it was charged. A state carries that list. Loading a state sets the
ledger to the state's and charges again every release the session knew that the state
does not hold, so a rollback, a resume followed by a rollback, states passed between
sessions, or a session copied with ``copy.deepcopy`` never drop a release from the
ledger. A state without the list (a ``dpsub-train`` checkpoint, an older API state) counts
as new releases each time it is loaded: its releases cannot be told from another run's
(on the safe side: loading one twice counts it twice).

A :class:`Journal` (``make_private(..., journal=PATH)``) appends every release the ledger
charges to a file before the release is written into the parameters' ``.grad``, so a
session opened on the same file after a crash charges the releases no saved state holds.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path

from dpsub.privacy.accountants import fsync_dir

#: (z, q) charged to the honest ledger, and (z, q) to the nominal one (None: none kept)
Charge = tuple[tuple[float, float], "tuple[float, float] | None"]
KEY = "api_releases"  # in a state_dict: [[id, z, q, z_nominal, q_nominal], ...]


@dataclass
class ReleaseBook:
    known: dict[str, Charge] = field(default_factory=dict)  # every release the ledger charges
    journal: Journal | None = None  # where each one is appended as it is charged

    def record(self, account) -> None:
        """The release just charged to ``account``'s ledgers (after it, not before). A random
        id, not a counter: a session copied with deepcopy must not name its next release as
        the original names its own."""
        last = lambda led: (float(led.history[-1][0]), float(led.history[-1][1]))  # noqa: E731
        nominal = last(account.nominal) if account.nominal is not None else None
        rid = secrets.token_hex(12)
        self.known[rid] = (last(account.ledger), nominal)  # first: the ledger charges it now
        if self.journal is not None:  # raises if the disk refuses: the release is not written
            self.journal.append({rid: self.known[rid]})

    def released(self, run) -> None:
        """The run's release hook: record (and journal) the release just charged, before it
        is written into ``.grad``."""
        self.record(run.account)

    def state(self) -> list[list]:
        return [[rid, *h, *(n or (None, None))] for rid, (h, n) in self.known.items()]

    def after_load(self, state: dict, account) -> int:
        """``account`` holds ``state``'s ledgers: charge every known release it lacks.
        Returns how many (a rollback's: releases that a replay would repeat)."""
        held, again = held_by(state), 0
        for rid, (honest, nominal) in self.known.items():
            if rid not in held and account.ledger is not None:
                account.ledger.step(*honest)
                if nominal is not None and account.nominal is not None:
                    account.nominal.step(*nominal)
                again += 1
        if self.journal is not None:  # the state's releases the ledger now charges too
            self.journal.append({r: c for r, c in held.items() if r not in self.known})
        self.known = {**held, **self.known}
        return again


def held_by(state: dict) -> dict[str, Charge]:
    """The releases ``state``'s ledger charges, by id (new ids for a state without them)."""
    if state.get(KEY) is not None:
        return {r[0]: ((r[1], r[2]), None if r[3] is None else (r[3], r[4])) for r in state[KEY]}
    ledger = state.get("ledger")
    if not ledger:
        return {}
    honest = _steps(ledger["history"])
    nominal = _steps(state["nominal"]["history"]) if state.get("nominal") else []
    pair = lambda i: nominal[i] if len(nominal) == len(honest) else None  # noqa: E731
    return {secrets.token_hex(12): (zq, pair(i)) for i, zq in enumerate(honest)}


def _steps(history) -> list[tuple[float, float]]:
    return [(float(z), float(q)) for z, q, n in history for _ in range(int(n))]


def privacy_mismatch(theirs: dict, ledger) -> str | None:
    """The first of delta, accountant and budget on which ``theirs`` (a ledger's state, or a
    journal's head) differs from ``ledger``: ``"delta 0.01, this session's 1e-05"``."""
    for key in ("delta", "accountant", "budget"):
        if theirs.get(key) != getattr(ledger, key):
            return f"{key} {theirs.get(key)!r}, this session's {getattr(ledger, key)!r}"
    return None


@dataclass
class Journal:
    """An append-only file of the releases a session's ledger charges, one JSON line each
    (``{"id", "z", "q", "zn", "qn"}``) after a head line with the privacy setting; each line
    is on disk (written in full, fsynced) before the release reaches ``.grad``. A write the
    disk refuses is cut back and raises; its rows are written with the next append. A last
    line cut short by a crash is a release that never left the process: it is dropped."""

    path: Path  # resolved when opened: a later os.chdir does not move it
    unwritten: dict[str, Charge] = field(default_factory=dict)

    @classmethod
    def open(cls, path: str | os.PathLike, account) -> tuple[Journal, dict[str, Charge]]:
        """The journal at ``path`` (created with ``account``'s privacy setting if absent) and
        the releases it holds, already charged to ``account``'s (fresh) ledgers. ValueError
        naming the file when it is not a journal or was written under another setting."""
        journal = cls(Path(path).resolve())
        head = json.dumps({"dpsub_api_journal": 1, **_setting(account.ledger),
                           "nominal": _setting(account.nominal)})  # fmt: skip
        text = journal.path.read_text() if journal.path.exists() else ""
        if "\n" not in text and head.startswith(text):  # new, or its head was cut by a crash
            journal.path.parent.mkdir(parents=True, exist_ok=True)
            journal.path.write_text("")
            journal._write(head + "\n")
            fsync_dir(journal.path.parent)
            return journal, {}
        rows = journal._rows(text, json.loads(head), account.ledger)
        held = {r["id"]: ((r["z"], r["q"]), None if r["zn"] is None else (r["zn"], r["qn"]))
                for r in rows}  # fmt: skip
        for honest, nominal in held.values():
            account.ledger.step(*honest)
            if nominal is not None and account.nominal is not None:
                account.nominal.step(*nominal)
        return journal, held

    def _rows(self, text: str, head: dict, ledger) -> list[dict]:
        """The rows of a journal whose head matches ``head`` (a cut last line removed)."""
        first, *lines = text.split("\n")
        try:
            theirs = json.loads(first)
            rows = [json.loads(line) for line in lines[:-1]]  # lines[-1]: "" or a cut line
        except json.JSONDecodeError:
            theirs = None
        if not isinstance(theirs, dict) or theirs.get("dpsub_api_journal") != 1:
            raise ValueError(f"journal: {self.path} is not a dpsub release journal")
        differs = privacy_mismatch({**theirs, "budget": theirs.get("budget") or math.inf}, ledger)
        if not differs and theirs.get("nominal") != head["nominal"]:
            differs = f"nominal ledger {theirs.get('nominal')}, this session's {head['nominal']}"
        if differs:
            raise ValueError(f"journal: {self.path} was written by a session of {differs}: a "
                             "journal continues only a session of the same privacy setting")  # fmt: skip
        if lines[-1]:  # a line cut by a crash: that release never reached .grad
            os.truncate(self.path, len(text.encode()) - len(lines[-1].encode()))
        return rows

    def append(self, releases: dict[str, Charge]) -> None:
        self.unwritten.update(releases)
        rows = [{"id": r, "z": h[0], "q": h[1], "zn": n[0] if n else None, "qn": n[1] if n else None}
                for r, (h, n) in self.unwritten.items()]  # fmt: skip
        if rows:
            self._write("".join(json.dumps(row) + "\n" for row in rows))
            self.unwritten.clear()

    def _write(self, text: str) -> None:
        """Append ``text`` in full and fsync it, or cut the file back to where it was and
        raise (a full disk, a file-size limit: no partial line stays behind)."""
        data = text.encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)  # no O_CREAT: a moved file raises
        try:
            size = os.fstat(fd).st_size
            try:
                done = 0
                while done < len(data):
                    done += os.write(fd, data[done:])
                os.fsync(fd)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.ftruncate(fd, size)
                raise
        finally:
            os.close(fd)


def _setting(ledger) -> dict | None:
    if ledger is None:
        return None
    budget = None if math.isinf(ledger.budget) else ledger.budget
    return {"delta": ledger.delta, "accountant": ledger.accountant, "budget": budget}
