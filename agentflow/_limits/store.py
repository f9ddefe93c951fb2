"""The rows of partner limits (docs/partner-limits.md, "What happens"): a partner's turns, places in
flight, waiters and breaker, all taken under the partner's row lock so every worker on every host
sees one truth; and the checkpoint and run of a step that waits for its turn. The one writer of
these rows: it applies `agentflow._limits.rules` (which decide) with the database's time, and
calls no partner (`agentflow._limits.limiter` does, between `turn_take` and `turn_return`).

A turn is decided in one short transaction: lock the partner's row (its time read after the
lock, from the database's clock), read who waits and what is in flight, then write the
decision. A step that got no turn waits (`step_wait_turn`) so that the wait spends no attempt,
holds no worker and never turns "may have happened" into "did not happen" (docs/protocol.md,
"Unknown outcomes").
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

from django.db import transaction

from agentflow._base.states import RunStatus, StepStatus
from agentflow._conf import settings
from agentflow._core import builds, dispatch, leases
from agentflow._limits import rules
from agentflow._limits.rules import CLOSED, HALF_OPEN, OPEN, Limit
from agentflow._store import sql
from agentflow._store.batches import PARTNER_HOLD
from agentflow._store.events import event_add
from agentflow._store.runs import Fenced
from agentflow._store.steps import ACTIVE, CheckpointRow, Claim
from agentflow.models import PartnerEvent, PartnerSlot, PartnerState, PartnerWaiter, RunEvent

# The names hosts' LOGGING knows, from when the rows and a step's wait were two store modules.
logger = logging.getLogger("agentflow.store.partners")
turns_logger = logging.getLogger("agentflow.store.turns")

PARTNERS = PartnerState._meta.db_table
SLOTS = PartnerSlot._meta.db_table
WAITERS = PartnerWaiter._meta.db_table
PARTNER_EVENTS = PartnerEvent._meta.db_table

#: A waiter with no turn given yet (a place, the breaker, an operator) is looked at again this
#: often anyway: a lost doorbell costs this much latency, never the run (I7).
RECHECK_SECONDS = 30.0
#: A place handed to the oldest waiter is kept for it this long; past it, it goes to the next.
GRANT_SECONDS = 30.0
#: Most waiters one resume hands turns to; the rest follow on the next pass.
RESUME_BATCH = 1000

RATE, CONCURRENCY, BREAKER, PAUSED, RESUMED = (
    "rate limit",
    "concurrency",
    "breaker open",
    "paused",
    "resumed",
)


@dataclass(frozen=True, kw_only=True)
class Turn:
    """The call may go: after `sleep_seconds` (a turn a few milliseconds off), holding place
    `slot` (returned by `turn_return`). `given_at`: when it was given (the database's time), to
    tell a 429 of a call scheduled before the key last slowed from one scheduled after."""

    slot: int
    probe: bool = False
    sleep_seconds: float = 0.0
    given_at: float = math.inf


@dataclass(frozen=True, kw_only=True)
class TurnWait:
    """The call may not go yet: the step waits `seconds` for `reason`."""

    reason: str
    seconds: float


#: The waiting line's order where a place or a probe frees (docs/partner-limits.md, "Who goes
#: next"): higher priority first (a run without one last), then arrival.
FIRST_IN_LINE = "COALESCE(r.priority, -1) DESC, w.id"


def epoch_now() -> str:
    """The database's time now, in epoch seconds: after a lock wait, not the transaction's start."""
    if sql.postgres():
        return "EXTRACT(EPOCH FROM clock_timestamp())::float8"
    return "((julianday('now') - 2440587.5) * 86400.0)"


def _live(alias: str) -> str:
    """SQL: the place is held (its lease runs and its owner process is not provably gone)."""
    return f"({alias}.lease_expires_at > %s AND NOT {sql.owner_gone(alias)})"


_ROW = (
    "next_turn_at, spent_until, blocked_until, speed_floor, speed_since, speed_ceiling, "
    "breaker, failures, opened_times, probe_at, paused, turn_shift, window_at, window_given, "
    "window_refused, prior_given, prior_refused"
)


@dataclass(frozen=True, kw_only=True)
class _Row:
    next_turn_at: float
    spent_until: float
    blocked_until: float
    speed_floor: float
    speed_since: float
    speed_ceiling: float
    breaker: str
    failures: int
    opened_times: int
    probe_at: float
    paused: bool
    turn_shift: float
    window_at: float
    window_given: int
    window_refused: int
    prior_given: int
    prior_refused: int
    now: float


def _lock(partner: str) -> _Row:
    """Lock the partner's row (creating it on its first call) and read it with the time."""
    query = (
        f"UPDATE {PARTNERS} SET failures = failures WHERE partner = %s "
        f"RETURNING {_ROW}, {epoch_now()}"
    )
    with sql.cursor() as cur:
        cur.execute(query, [partner])
        row = cur.fetchone()
        if row is None:
            cur.execute(
                f"INSERT INTO {PARTNERS} (partner, next_turn_at, spent_until, blocked_until, "
                "speed_floor, speed_since, speed_ceiling, breaker, failures, opened_times, "
                "probe_at, paused, turn_shift, window_at, window_given, window_refused, "
                "prior_given, prior_refused, pause_reason, paused_by, rate_limited_total, "
                "last_rate_limited_reason, errors_total, last_error, updated_at) VALUES (%s, 0, "
                "0, 0, 1, 0, 1, 'closed', 0, 0, 0, %s, 0, 0, 0, 0, 0, 0, '', '', "
                f"0, '', 0, '', {sql.now()}) ON CONFLICT (partner) DO NOTHING",
                [partner, False],
            )
            cur.execute(query, [partner])
            row = cur.fetchone()
    assert row is not None
    return _Row(
        next_turn_at=float(row[0]),
        spent_until=float(row[1]),
        blocked_until=float(row[2]),
        speed_floor=float(row[3]),
        speed_since=float(row[4]),
        speed_ceiling=float(row[5]),
        breaker=row[6],
        failures=int(row[7]),
        opened_times=int(row[8]),
        probe_at=float(row[9]),
        paused=bool(row[10]),
        turn_shift=float(row[11]),
        window_at=float(row[12]),
        window_given=int(row[13]),
        window_refused=int(row[14]),
        prior_given=int(row[15]),
        prior_refused=int(row[16]),
        now=float(row[17]),
    )


@dataclass(frozen=True, kw_only=True)
class _Queue:
    mine: int | None
    mine_reason: str
    mine_go_at: float | None
    #: The oldest waiter of a live step with no turn given yet.
    first_pending: int | None
    pending_places: int
    granted_places: int
    in_flight: int
    #: The earliest turn reserved by another step that it may still use (on the schedule).
    ahead: float | None


def _queue(
    partner: str, run_id: str, seq: int | None, now: float, places: bool, keep_from: float
) -> _Queue:
    """Who waits and what is in flight, read after the lock (a new snapshot)."""
    live_waiter = (
        f"EXISTS (SELECT 1 FROM {sql.RUNS} r WHERE r.id = w.run_id AND r.current_seq = w.seq "
        f"AND r.status IN ({sql.placeholders(ACTIVE)}))"
    )
    parts = [
        f"(SELECT id FROM {WAITERS} WHERE partner = %s AND run_id = %s AND seq = %s)",
        f"(SELECT reason FROM {WAITERS} WHERE partner = %s AND run_id = %s AND seq = %s)",
        f"(SELECT go_at FROM {WAITERS} WHERE partner = %s AND run_id = %s AND seq = %s)",
        f"(SELECT MIN(w.id) FROM {WAITERS} w WHERE w.partner = %s AND w.go_at IS NULL "
        f"AND {live_waiter})",
    ]
    mine = [partner, run_id, seq if seq is not None else -1]
    params: list[Any] = [*mine, *mine, *mine, partner, *ACTIVE]
    if places:
        parts += [
            f"(SELECT COUNT(*) FROM {WAITERS} w WHERE w.partner = %s AND w.reason = %s "
            f"AND w.go_at IS NULL AND {live_waiter})",
            f"(SELECT COUNT(*) FROM {WAITERS} w WHERE w.partner = %s AND w.reason = %s "
            "AND w.go_at IS NOT NULL AND w.go_at > %s)",
        ]
        params += [partner, CONCURRENCY, *ACTIVE, partner, CONCURRENCY, now - GRANT_SECONDS]
    parts.append(f"(SELECT COUNT(*) FROM {SLOTS} s WHERE s.partner = %s AND {_live('s')})")
    params += [partner, now]
    parts.append(
        f"(SELECT MIN(go_at) FROM {WAITERS} WHERE partner = %s AND go_at >= %s "
        f"AND reason IN (%s, %s) AND NOT (run_id = %s AND seq = %s))"
    )
    params += [partner, keep_from, RATE, RESUMED, *mine[1:]]
    row = sql.fetch_one(f"SELECT {', '.join(parts)}", params)
    assert row is not None
    if not places:
        row = (*row[:4], 0, 0, *row[4:])
    return _Queue(
        mine=row[0],
        mine_reason=row[1] or "",
        mine_go_at=float(row[2]) if row[2] is not None else None,
        first_pending=row[3],
        pending_places=int(row[4]),
        granted_places=int(row[5]),
        in_flight=int(row[6]),
        ahead=float(row[7]) if row[7] is not None else None,
    )


def turn_take(limit: Limit, *, run_id: str = "", seq: int | None = None) -> Turn | TurnWait:
    """May a call to `limit.partner` go now, for step `seq` of `run_id` (none: a call outside
    any step, which never queues)? In arrival order: a step that waited keeps its place."""
    partner = limit.partner
    with transaction.atomic():
        row = _lock(partner)
        now = row.now
        interval = rules.interval_seconds(limit, _speed(row, now))
        queue = _queue(
            partner,
            run_id,
            seq,
            now,
            places=limit.concurrency is not None,
            keep_from=now - interval - row.turn_shift,
        )
        changes: dict[str, Any] = {}
        probe = False
        oldest = queue.first_pending is None or queue.first_pending == queue.mine
        if row.paused:
            return _wait(partner, run_id, seq, queue, PAUSED, RECHECK_SECONDS, now)
        if row.breaker != CLOSED:
            probe_due = now >= row.probe_at
            if not (probe_due and oldest):
                # The oldest waiter is woken for the probe; the rest when the breaker closes.
                until = max(row.probe_at - now, 0.05) if oldest else RECHECK_SECONDS
                return _wait(partner, run_id, seq, queue, BREAKER, until, now)
            probe = True
            changes |= {"breaker": HALF_OPEN, "probe_at": now + _slot_seconds()}
        sleep = 0.0
        if limit.concurrency is not None and not probe:
            granted = queue.mine_reason == CONCURRENCY and queue.mine_go_at is not None
            free = limit.concurrency - queue.in_flight - queue.granted_places + int(granted)
            if free <= 0 or (not granted and queue.pending_places and not oldest):
                return _wait(partner, run_id, seq, queue, CONCURRENCY, RECHECK_SECONDS, now)
        reserved = queue.mine_go_at if queue.mine_reason in (RATE, RESUMED) else None
        if reserved is not None:
            reserved += row.turn_shift
        rated = limit.rate_per_second is not None or row.blocked_until > now
        if reserved is not None and reserved - now > rules.SLEEP_IN_PROCESS_SECONDS:
            # Early: the turn stays this step's; it comes back a little before it.
            return TurnWait(reason=queue.mine_reason, seconds=_early(reserved - now))
        if rated and not probe:
            decided = _rate_turn(row, queue, reserved, interval)
            changes |= decided.changes
            turn = decided.turn
            if turn - now > rules.SLEEP_IN_PROCESS_SECONDS:
                if changes:
                    _update(partner, changes)
                if decided.own:
                    return TurnWait(reason=queue.mine_reason, seconds=_early(turn - now))
                go_at = turn - changes.get("turn_shift", row.turn_shift)
                return _wait(
                    partner, run_id, seq, queue, RATE, _early(turn - now), now, go_at=go_at
                )
            changes["spent_until"] = turn + interval
            changes |= _window(row, now, given=1).changes
            sleep = max(0.0, turn - now)
        if changes:
            _update(partner, changes)
        if queue.mine is not None:
            sql.execute(f"DELETE FROM {WAITERS} WHERE id = %s", [queue.mine])
        slot = _hold(partner, run_id, seq, probe=probe, now=now)
    return Turn(slot=slot, probe=probe, sleep_seconds=sleep, given_at=now)


@dataclass(frozen=True)
class _RateTurn:
    turn: float
    own: bool
    changes: dict[str, Any]


def _rate_turn(row: _Row, queue: _Queue, reserved: float | None, interval: float) -> _RateTurn:
    """When the call may go, by the rate (times real; the schedule's plus `turn_shift`).

    No call goes sooner than one interval after the last turn given (`spent_until`), so the
    partner sees at most the limit (+1 in a second, for the edges). Within that:
    - a step that reserved a turn and came for it (early, or within an interval late) goes
      then: its own turn, nobody else's;
    - a turn whose step is not there (reserved, due, its step not come: busy workers, a long
      broker queue) goes to a step that is, and every reserved turn moves back to make room
      (`turn_shift`): no turn goes unused while steps wait, and none is lost: the step that
      was late finds its turn moved back, or, later still, goes next as soon as it comes;
    - else the step reserves the key's next turn, after everyone waiting.
    """
    now, shift = row.now, row.turn_shift
    head = max(now, row.spent_until, row.blocked_until)
    ahead = queue.ahead + shift if queue.ahead is not None else None
    if reserved is not None and reserved >= row.blocked_until and now <= reserved + interval:
        return _RateTurn(max(head, reserved), True, {})
    free = ahead is None or ahead >= head + interval or ahead <= now or reserved is not None
    if free and head - now <= rules.SLEEP_IN_PROCESS_SECONDS:
        changes = {}
        if ahead is not None and ahead < head + interval:
            changes["turn_shift"] = shift + head + interval - ahead
        return _RateTurn(head, False, changes)
    if reserved is not None:
        # Late, with calls given ahead: next, as the first step that came for its turn.
        return _RateTurn(head, False, {})
    turn = max(head, row.next_turn_at + shift)
    return _RateTurn(turn, False, {"next_turn_at": turn + interval - shift})


def _early(seconds: float) -> float:
    """A wait of `seconds` for a reserved turn, as the step is published again: it comes back
    a little early and sleeps the rest in the worker, so a broker's and a worker's delay do
    not make it miss its turn."""
    return max(0.0, seconds - rules.ARRIVE_EARLY_SECONDS)


@dataclass(frozen=True)
class _Window:
    changes: dict[str, Any]
    #: Turns given and 429s in the last `seconds` (this second so far and the one before).
    given: int
    refused: int
    seconds: float


def _window(row: _Row, now: float, *, given: int = 0, refused: int = 0) -> _Window:
    """Count a turn given or a 429 in the key's one-second windows (written with the changes
    the caller makes to the row anyway)."""
    age = now - row.window_at
    if age < 1.0:
        start, cur_given, cur_refused = row.window_at, row.window_given, row.window_refused
        prior_given, prior_refused = row.prior_given, row.prior_refused
    else:
        start, cur_given, cur_refused = now, 0, 0
        adjacent = age < 2.0
        prior_given = row.window_given if adjacent else 0
        prior_refused = row.window_refused if adjacent else 0
    cur_given, cur_refused = cur_given + given, cur_refused + refused
    changes = {
        "window_at": start,
        "window_given": cur_given,
        "window_refused": cur_refused,
        "prior_given": prior_given,
        "prior_refused": prior_refused,
    }
    seconds = (now - start) + (1.0 if prior_given or prior_refused else 0.0)
    return _Window(
        changes,
        given=cur_given + prior_given,
        refused=cur_refused + prior_refused,
        seconds=max(seconds, 1.0),
    )


def _speed(row: _Row, now: float) -> float:
    return rules.speed(
        floor=row.speed_floor, since=row.speed_since, now=now, ceiling=row.speed_ceiling
    )


def _slot_seconds() -> float:
    return float(settings.AGENTFLOW_PARTNER_SLOT_SECONDS)


def _update(partner: str, changes: dict[str, Any]) -> None:
    sql.update(PARTNERS, {**changes, "updated_at": sql.at_now()}, "partner = %s", [partner])


def _hold(partner: str, run_id: str, seq: int | None, *, probe: bool, now: float) -> int:
    _owner, lock, server = leases.current_owner()
    columns, exprs, params = sql._insert_parts(
        {
            "partner": partner,
            "run_id": run_id,
            "seq": seq,
            "probe": probe,
            "lease_expires_at": now + _slot_seconds(),
            "lease_lock": lock,
            "lease_server": server,
            "started_at": sql.at_now(),
        }
    )
    row = sql.fetch_one(f"INSERT INTO {SLOTS} ({columns}) VALUES ({exprs}) RETURNING id", params)
    assert row is not None
    return int(row[0])


def _wait(
    partner: str,
    run_id: str,
    seq: int | None,
    queue: _Queue,
    reason: str,
    seconds: float,
    now: float,
    *,
    go_at: float | None = None,
) -> TurnWait:
    """Take (or keep) the step's place in the queue: a waiter keeps its arrival order."""
    if seq is None:
        return TurnWait(reason=reason, seconds=seconds)  # outside a step: the caller sleeps
    if queue.mine is None:
        sql.insert(
            WAITERS,
            {
                "partner": partner,
                "run_id": run_id,
                "seq": seq,
                "reason": reason,
                "go_at": go_at,
                "created_at": sql.at_now(),
            },
        )
    elif queue.mine_reason != reason or queue.mine_go_at != go_at:
        sql.update(WAITERS, {"reason": reason, "go_at": go_at}, "id = %s", [queue.mine])
    return TurnWait(reason=reason, seconds=max(seconds, 0.0))


# --- after the call -----------------------------------------------------------------------------
OK, NEUTRAL, RATE_LIMITED, UNAVAILABLE = "ok", "neutral", "rate_limited", "unavailable"


def turn_return(
    limit: Limit,
    turn: Turn,
    *,
    outcome: str,
    detail: str = "",
    block_seconds: float = 0.0,
    rate_reason: str = "",
) -> None:
    """Give the place back and record what the partner said: an answer closes a probing
    breaker and clears the failure count; a 429 slows the key for every run; a timeout, 5xx
    or connection error counts toward opening the breaker."""
    partner = limit.partner
    quiet = outcome in (OK, NEUTRAL) and not turn.probe
    with transaction.atomic():
        sql.execute(f"DELETE FROM {SLOTS} WHERE id = %s", [turn.slot])
        if quiet:
            sql.execute(
                f"UPDATE {PARTNERS} SET failures = 0 WHERE partner = %s AND failures > 0",
                [partner],
            )
            if limit.concurrency is not None:
                _grant_places(limit)
            return
        row = _lock(partner)
        now = row.now
        changes: dict[str, Any] = {}
        resume = False
        if outcome == UNAVAILABLE:
            failures = row.failures + 1
            changes |= {
                "failures": failures,
                "errors_total": sql.Expr("errors_total + 1", ()),
                "last_error_at": now,
                "last_error": detail[:1000],
            }
            _event(partner, PartnerEvent.Kind.ERROR, detail)
            if turn.probe or (row.breaker == CLOSED and rules.trips(failures)):
                opened = row.opened_times + 1
                wait = rules.cooldown_seconds(opened)
                changes |= {"breaker": OPEN, "opened_times": opened, "probe_at": now + wait}
                _event(
                    partner,
                    PartnerEvent.Kind.BREAKER_OPEN,
                    f"{'the probe failed' if turn.probe else f'{failures} failures in a row'}"
                    f" ({detail}); next probe in {wait:.0f} s",
                )
                _wake_for_probe(partner, wait)
        else:
            changes["failures"] = 0
            if turn.probe:
                changes |= {
                    "breaker": CLOSED,
                    "opened_times": 0,
                    "probe_at": 0.0,
                    "speed_floor": rules.RAMP_START_FACTOR,
                    "speed_since": now,
                    "speed_ceiling": 1.0,
                }
                _event(partner, PartnerEvent.Kind.BREAKER_CLOSED, "the probe was answered")
                resume = True
        if outcome == RATE_LIMITED:
            changes |= _slow_down(limit, turn, row, now, changes, detail, block_seconds)
            changes |= {
                "rate_limited_total": sql.Expr("rate_limited_total + 1", ()),
                "last_rate_limited_at": now,
                "last_rate_limited_reason": rate_reason[:100],
            }
        _update(partner, changes)
        if resume:
            merged = {**row.__dict__, **changes}
            _resume(limit, merged, now)
        elif limit.concurrency is not None:
            _grant_places(limit)


def _slow_down(
    limit: Limit,
    turn: Turn,
    row: _Row,
    now: float,
    changes: dict[str, Any],
    detail: str,
    block_seconds: float,
) -> dict[str, Any]:
    """A 429: the key is blocked for what the partner said, for every run; a call given its
    turn since the key last slowed halves its speed (a 429 of a call scheduled before then
    came at the old speed: the key already slowed for it), and every turn reserved so far is
    moved to the new speed, after the block. So the key's speed after k such 429s is at most
    its limit / 2**k (down to the floor), and what was scheduled at the old speed does not go
    at it."""
    share = _speed(row, now)
    fresh = turn.given_at >= row.speed_since
    until = max(row.blocked_until, now + block_seconds)
    window = _window(row, now, refused=1)
    slowed: dict[str, Any] = {"blocked_until": until, **window.changes}
    floor = changes.get("speed_floor", row.speed_floor)
    if fresh:
        accepted = rules.accepted_share(
            limit, given=window.given, refused=window.refused, seconds=window.seconds
        )
        floor = min(rules.slowed(share, accepted), changes.get("speed_floor", 1.0))
        slowed |= {
            "speed_floor": floor,
            "speed_ceiling": rules.ceiling_after(share, accepted),
            "speed_since": now,
        }
    shift = row.turn_shift
    slowed["next_turn_at"] = max(row.next_turn_at, until - shift)
    end = _respace(limit, until - shift, rules.respace_interval(limit, floor))
    if end is not None:
        slowed["next_turn_at"] = max(end, until - shift)
    _event(
        limit.partner,
        PartnerEvent.Kind.RATE_LIMITED,
        f"{detail} ({f'slowed to {floor:.0%}' if fresh else f'at {floor:.0%}'} of its limit; "
        f"blocked {block_seconds:.2f} s)",
    )
    return slowed


def _respace(limit: Limit, start: float, interval: float) -> float | None:
    """Every turn reserved at `limit.partner`, in its order, one `interval` apart from `start`
    at the earliest (or from the first reserved, if later); the end of the last (None: none).
    On the key's schedule (without `turn_shift`). A queue reserved one interval apart at a
    faster speed only moves later; a hole in it closes (its steps come early, or late and go
    next), and no two calls go closer than an interval whatever the queue says (`spent_until`)."""
    reserved = [RATE, RESUMED]
    row = sql.fetch_one(
        f"SELECT COUNT(*), MIN(go_at) FROM {WAITERS} WHERE partner = %s AND go_at IS NOT NULL "
        f"AND reason IN ({sql.placeholders(reserved)})",
        [limit.partner, *reserved],
    )
    if row is None or not row[0]:
        return None
    first = max(start, float(row[1]))
    sql.execute(
        f"UPDATE {WAITERS} SET go_at = %s + (o.n - 1) * %s FROM (SELECT id, ROW_NUMBER() "
        f"OVER (ORDER BY go_at, id) AS n FROM {WAITERS} WHERE partner = %s AND go_at IS NOT "
        f"NULL AND reason IN ({sql.placeholders(reserved)})) o WHERE {WAITERS}.id = o.id",
        [first, interval, limit.partner, *reserved],
    )
    return first + int(row[0]) * interval


def _event(partner: str, kind: str, detail: str, actor: str = "") -> None:
    sql.insert(
        PARTNER_EVENTS,
        {"partner": partner, "kind": kind, "actor": actor, "detail": detail, "at": sql.at_now()},
    )


def _grant_places(limit: Limit) -> None:
    """Free places go to the oldest waiters for one, who are woken for it."""
    assert limit.concurrency is not None
    now_row = sql.fetch_one(f"SELECT {epoch_now()}", [])
    assert now_row is not None
    now = float(now_row[0])
    taken = sql.fetch_one(
        f"SELECT (SELECT COUNT(*) FROM {SLOTS} s WHERE s.partner = %s AND {_live('s')}), "
        f"(SELECT COUNT(*) FROM {WAITERS} WHERE partner = %s AND reason = %s "
        "AND go_at IS NOT NULL AND go_at > %s)",
        [limit.partner, now, limit.partner, CONCURRENCY, now - GRANT_SECONDS],
    )
    assert taken is not None
    free = limit.concurrency - int(taken[0]) - int(taken[1])
    if free <= 0:
        return
    oldest = sql.fetch_all(
        f"SELECT w.id, w.run_id, w.seq FROM {WAITERS} w JOIN {sql.RUNS} r ON r.id = w.run_id "
        f"AND r.current_seq = w.seq AND r.status IN ({sql.placeholders(ACTIVE)}) "
        "WHERE w.partner = %s AND w.go_at IS NULL ORDER BY " + FIRST_IN_LINE + " LIMIT %s",
        [*ACTIVE, limit.partner, free],
    )
    for waiter_id, run_id, seq in oldest:
        sql.update(WAITERS, {"go_at": now, "reason": CONCURRENCY}, "id = %s", [waiter_id])
        _wake(run_id, seq, 0.0)


def _wake(run_id: str, seq: int, seconds: float) -> None:
    """The waiting run's turn is given: it is looked at then (and published, if soon, to where
    it belongs: its build's queue when it is pinned). It stays held (`partner:<key>`) until
    its step is claimed, or waits again with the new reason."""
    assignments, values = sql.set_clause({"wake_at": sql.at_now_plus(seconds)})
    row = sql.fetch_one(
        f"UPDATE {sql.RUNS} SET {assignments} WHERE id = %s AND current_seq = %s "
        f"AND status IN ({sql.placeholders(ACTIVE)}) RETURNING build, pinned",
        [*values, run_id, seq, *ACTIVE],
    )
    if row is not None and seconds <= dispatch.MAX_COUNTDOWN_SECONDS:
        queue = builds.route(row[0], bool(row[1]))
        dispatch.send_step_on_commit(run_id, seq, countdown=seconds or None, queue=queue)


def _wake_for_probe(partner: str, seconds: float) -> None:
    """The oldest waiter is the next probe: it is woken when the probe may go (the others wait
    for the breaker's answer)."""
    oldest = sql.fetch_one(
        f"SELECT w.run_id, w.seq FROM {WAITERS} w JOIN {sql.RUNS} r ON r.id = w.run_id "
        f"AND r.current_seq = w.seq AND r.status IN ({sql.placeholders(ACTIVE)}) "
        "WHERE w.partner = %s AND w.go_at IS NULL ORDER BY " + FIRST_IN_LINE + " LIMIT 1",
        [*ACTIVE, partner],
    )
    if oldest is not None:
        _wake(oldest[0], oldest[1], seconds)


def _resume(limit: Limit, row: dict[str, Any], now: float) -> None:
    """The breaker closed or an operator resumed: the waiters get turns oldest first, at the
    key's speed as it climbs back from its slow start, within the limit."""
    waiting = sql.fetch_all(
        f"SELECT w.id, w.run_id, w.seq FROM {WAITERS} w JOIN {sql.RUNS} r ON r.id = w.run_id "
        f"AND r.current_seq = w.seq AND r.status IN ({sql.placeholders(ACTIVE)}) "
        "WHERE w.partner = %s AND w.go_at IS NULL ORDER BY " + FIRST_IN_LINE + " LIMIT %s",
        [*ACTIVE, limit.partner, RESUME_BATCH],
    )
    shift = row["turn_shift"]
    turn = max(now, row["next_turn_at"] + shift, row["blocked_until"], row["spent_until"])
    for waiter_id, run_id, seq in waiting:
        sql.update(WAITERS, {"go_at": turn - shift, "reason": RESUMED}, "id = %s", [waiter_id])
        _wake(run_id, seq, _early(turn - now))
        if limit.rate_per_second is None:
            turn += rules.UNRATED_RESUME_SPACING_SECONDS
        else:
            share = rules.speed(
                floor=row["speed_floor"],
                since=row["speed_since"],
                now=turn,
                ceiling=row["speed_ceiling"],
            )
            turn += rules.interval_seconds(limit, share)
    if waiting:
        _update(limit.partner, {"next_turn_at": turn - shift})


def partner_forget(partner: str) -> None:
    """Every row of `partner`: its state, places, waiters and events (a bench's clean-up, once
    nothing calls it any more)."""
    with transaction.atomic():
        for table in (SLOTS, WAITERS, PARTNER_EVENTS, PARTNERS):
            sql.execute(f"DELETE FROM {table} WHERE partner = %s", [partner])


def wait_gone(run_id: str, seq: int) -> None:
    """The step's place in any queue, given up (it finished, or moved on)."""
    sql.execute(f"DELETE FROM {WAITERS} WHERE run_id = %s AND seq = %s", [run_id, seq])


def partners_open(partners: list[str]) -> set[str]:
    """Which of `partners` a waiting step may ask for its turn now (one query): not paused by
    an operator, and no breaker open before its probe time. Only the turn says whether the call
    goes (`turn_take`); this only says whether asking is worth a message."""
    if not partners:
        return set()
    closed = {
        row[0]
        for row in sql.fetch_all(
            f"SELECT partner FROM {PARTNERS} WHERE partner IN ({sql.placeholders(partners)}) "
            f"AND (paused OR (breaker <> %s AND probe_at > {epoch_now()}))",
            [*partners, CLOSED],
        )
    }
    return {partner for partner in partners if partner not in closed}


# --- operators ----------------------------------------------------------------------------------
def partner_pause(limit: Limit, *, actor: str, reason: str) -> bool:
    """Hold every call to the partner until resumed; recorded with actor and reason. Calls in
    flight finish. Returns False if it was paused already."""
    with transaction.atomic():
        row = _lock(limit.partner)
        if row.paused:
            return False
        _update(limit.partner, {"paused": True, "pause_reason": reason, "paused_by": actor})
        _event(limit.partner, PartnerEvent.Kind.PAUSED, reason, actor)
    return True


def partner_resume(limit: Limit, *, actor: str, reason: str) -> bool:
    """Let calls go again, the waiters oldest first at a slow start (as a closing breaker);
    recorded. A hand-resume also closes an open breaker: the operator knows it is back."""
    with transaction.atomic():
        row = _lock(limit.partner)
        if not row.paused and row.breaker == CLOSED:
            return False
        changes = {
            "paused": False,
            "pause_reason": "",
            "paused_by": "",
            "breaker": CLOSED,
            "failures": 0,
            "opened_times": 0,
            "speed_floor": rules.RAMP_START_FACTOR,
            "speed_since": row.now,
            "speed_ceiling": 1.0,
        }
        _update(limit.partner, changes)
        _event(limit.partner, PartnerEvent.Kind.RESUMED, reason, actor)
        _resume(limit, {**row.__dict__, **changes}, row.now)
    return True


def partners_tick(configured: dict[str, Limit]) -> int:
    """The sweeper's pass: places freed by a lease that ran out or an owner that died go to
    the oldest waiters (and their rows go); waiters of steps that moved on are dropped.
    Returns waiters woken."""
    sql.execute(
        f"DELETE FROM {WAITERS} WHERE NOT EXISTS (SELECT 1 FROM {sql.RUNS} r WHERE "
        f"r.id = {WAITERS}.run_id AND r.current_seq = {WAITERS}.seq AND r.status IN "
        f"({sql.placeholders(ACTIVE)}))",
        list(ACTIVE),
    )
    now_row = sql.fetch_one(f"SELECT {epoch_now()}", [])
    assert now_row is not None
    # Places nobody will give back (their process died, or their lease ran out): free already,
    # their rows go.
    sql.execute(
        f"DELETE FROM {SLOTS} WHERE id IN (SELECT s.id FROM {SLOTS} s WHERE NOT {_live('s')})",
        [float(now_row[0])],
    )
    woken = 0
    for limit in configured.values():
        if limit.concurrency is None:
            continue
        with transaction.atomic():
            _lock(limit.partner)
            before = sql.fetch_one(
                f"SELECT COUNT(*) FROM {WAITERS} WHERE partner = %s AND go_at IS NULL",
                [limit.partner],
            )
            _grant_places(limit)
            after = sql.fetch_one(
                f"SELECT COUNT(*) FROM {WAITERS} WHERE partner = %s AND go_at IS NULL",
                [limit.partner],
            )
            woken += int(before[0]) - int(after[0]) if before and after else 0
    return woken


@dataclass(frozen=True, kw_only=True)
class PartnerView:
    """One partner as the admin page and the metrics show it."""

    partner: str
    limit: Limit | None
    breaker: str
    paused: bool
    pause_reason: str
    paused_by: str
    in_flight: int
    waiting: int
    waiting_by_reason: dict[str, int]
    speed: float
    failures: int
    rate_limited_total: int
    last_rate_limited_at: float | None
    last_rate_limited_reason: str
    errors_total: int
    last_error_at: float | None
    last_error: str
    probe_at: float
    now: float


def partners_view(configured: dict[str, Limit]) -> list[PartnerView]:
    """Every configured or recorded partner, now (nothing to read when none is configured
    and none was ever called: a scrape of an unlimited site costs one statement)."""
    if not configured and not PartnerState.objects.exists():
        return []
    now_row = sql.fetch_one(f"SELECT {epoch_now()}", [])
    assert now_row is not None
    now = float(now_row[0])
    states = {s.partner: s for s in PartnerState.objects.all()}
    flight = {
        partner: n
        for partner, n in sql.fetch_all(
            f"SELECT s.partner, COUNT(*) FROM {SLOTS} s WHERE {_live('s')} GROUP BY s.partner",
            [now],
        )
    }
    waits: dict[str, dict[str, int]] = {}
    for partner, reason, n in sql.fetch_all(
        f"SELECT w.partner, w.reason, COUNT(*) FROM {WAITERS} w JOIN {sql.RUNS} r "
        f"ON r.id = w.run_id AND r.current_seq = w.seq AND r.status IN "
        f"({sql.placeholders(ACTIVE)}) GROUP BY w.partner, w.reason",
        list(ACTIVE),
    ):
        waits.setdefault(partner, {})[reason] = int(n)
    views = []
    for partner in sorted(set(configured) | set(states)):
        state = states.get(partner) or PartnerState(partner=partner)
        views.append(
            PartnerView(
                partner=partner,
                limit=configured.get(partner),
                breaker=state.breaker,
                paused=state.paused,
                pause_reason=state.pause_reason,
                paused_by=state.paused_by,
                in_flight=int(flight.get(partner, 0)),
                waiting=sum(waits.get(partner, {}).values()),
                waiting_by_reason=waits.get(partner, {}),
                speed=rules.speed(
                    floor=state.speed_floor,
                    since=state.speed_since,
                    now=now,
                    ceiling=state.speed_ceiling,
                ),
                failures=state.failures,
                rate_limited_total=state.rate_limited_total,
                last_rate_limited_at=state.last_rate_limited_at,
                last_rate_limited_reason=state.last_rate_limited_reason,
                errors_total=state.errors_total,
                last_error_at=state.last_error_at,
                last_error=state.last_error,
                probe_at=state.probe_at,
                now=now,
            )
        )
    return views


# --- a step that waits for its turn ---------------------------------------------------------------
_RUN_AT_STEP = f"id = %s AND current_seq = %s AND status IN ({sql.placeholders(ACTIVE)})"


def step_wait_turn(
    run_id: str,
    seq: int,
    *,
    partner: str,
    why: str,
    seconds: float,
    claim: Claim | None = None,
    seen: CheckpointRow | None = None,
    unknown: bool = False,
    spent: bool = False,
) -> bool:
    """The step at `seq` waits `seconds` for its turn at `partner` (`why`: "waiting for stripe:
    rate limit"); the run is WAITING. Returns False when fenced out.

    `claim`: an effect or llm step's claim. Its attempt is given back (a wait is not an
    attempt). A takeover's checkpoint (`outcome_unknown`: a lost owner's call may have
    happened) stays IN_PROGRESS with its lease released, so the next claim asks the partner
    again before anything (so does one whose call may have happened and whose reconcile was
    refused its turn: `unknown`); any other becomes retryable FAILED, which "may have happened" as
    well. `spent`: a call of this attempt went and failed, so the attempt counts (its bound
    still parks a partner that keeps failing, docs/protocol.md, "Unknown outcomes"). Without a claim
    (a read step) only the run and any earlier failed checkpoint move.

    The run is held as routing holds it (`partner:<key>`, docs/deploys.md, "Builds"): one wait path
    and one reason surface for a build's worker and a partner's turn. A held event says why the
    first time it waits for this partner at this step, or when the reason changed; its message (a
    countdown) goes to where the run belongs (`builds.route`), as every release of a hold does.
    """
    seconds = max(float(seconds), 0.0)
    released = {
        "lease_owner": "",
        "lease_lock": None,
        "error": why[:4000],
    }
    try:
        with transaction.atomic():
            if claim is not None:
                if claim.outcome_unknown or unknown:
                    changes = {
                        **released,
                        "lease_expires_at": sql.at_now(),
                        "fence": claim.fence + 1,
                    }
                else:
                    changes = {
                        **released,
                        "status": StepStatus.FAILED,
                        "retryable": True,
                        "retry_at": None,
                        "lease_expires_at": None,
                        "finished_at": sql.at_now(),
                        "fence": claim.fence + 1,
                    }
                if not spent:
                    changes["attempts"] = sql.Expr("attempts - 1", ())
                if not sql.update(
                    sql.STEPS,
                    changes,
                    "run_id = %s AND seq = %s AND status = %s AND fence = %s",
                    [run_id, seq, StepStatus.IN_PROGRESS, claim.fence],
                ):
                    return False
            elif seen is not None and seen.status == StepStatus.FAILED:
                sql.update(
                    sql.STEPS,
                    {"retry_at": None, "error": why[:4000]},
                    "run_id = %s AND seq = %s AND fence = %s AND status = %s",
                    [run_id, seq, seen.fence, StepStatus.FAILED],
                )
            # A turn handed out meanwhile (a freed place) wakes it sooner than it asked.
            given = sql.fetch_one(
                f"SELECT MIN(w.go_at + CASE WHEN w.reason = %s THEN 0 ELSE COALESCE(("
                f"SELECT p.turn_shift FROM {PARTNERS} p WHERE p.partner = w.partner), 0) END) "
                f"- {epoch_now()} FROM {WAITERS} w "
                "WHERE w.partner = %s AND w.run_id = %s AND w.seq = %s AND w.go_at IS NOT NULL",
                [CONCURRENCY, partner, run_id, seq],
            )
            if given is not None and given[0] is not None:
                seconds = max(0.0, min(seconds, float(given[0])))
            token = f"{PARTNER_HOLD}:{partner}"
            before = sql.fetch_one(
                f"SELECT hold FROM {sql.RUNS} WHERE id = %s"
                + (" FOR UPDATE" if sql.postgres() else ""),
                [run_id],
            )
            assignments, values = sql.set_clause(
                {
                    "status": RunStatus.WAITING,
                    "wake_at": sql.at_now_plus(seconds),
                    "updated_at": sql.at_now(),
                    "hold": token,
                }
            )
            row = sql.fetch_one(
                f"UPDATE {sql.RUNS} SET {assignments} WHERE {_RUN_AT_STEP} RETURNING build, pinned",
                [*values, run_id, seq, *ACTIVE],
            )
            if row is None:
                raise Fenced
            build, pinned = row[0], bool(row[1])
            if before is None or before[0] != token or not _same_held_reason(run_id, seq, why):
                event_add(run_id, RunEvent.Kind.HELD, why, seq=seq, data={"hold": token})
            if seconds <= dispatch.MAX_COUNTDOWN_SECONDS:
                dispatch.send_step_on_commit(
                    run_id, seq, countdown=seconds or None, queue=builds.route(build, pinned)
                )
    except Fenced:
        return False
    return True


def _same_held_reason(run_id: str, seq: int, why: str) -> bool:
    """Did the run's last held event at `seq` say exactly this?"""
    row = sql.fetch_one(
        f"SELECT detail FROM {sql.EVENTS} WHERE run_id = %s AND kind = %s AND seq = %s "
        "ORDER BY id DESC LIMIT 1",
        [run_id, RunEvent.Kind.HELD, seq],
    )
    return row is not None and row[0] == why
