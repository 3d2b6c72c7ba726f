"""The tick arithmetic of periodic jobs: which instants an entry comes due at. No database, no ORM.

Two kinds of entry:

- ``every``: seconds, aligned to the Unix epoch, so that every worker computes the very same
  instants. Real elapsed time; daylight saving does not exist for it.
- ``cron``: a 5-field expression read as *wall-clock time* in the entry's time zone. Each matching
  wall-clock time runs once, as classic cron does:

  * a wall-clock time that a fall-back repeats (``30 2 * * *`` in Europe/Berlin on the last
    Sunday of October, when 02:00-02:59 happens twice) runs once, at its first occurrence;
  * a wall-clock time that a spring-forward skips (02:30 on the last Sunday of March) runs once,
    at the instant the clock jumps (03:00 local time); several skipped times make one tick.

  So an hourly ``0 * * * *`` in such a zone runs 23 times on the spring-forward day and 24 times
  on the fall-back day (with two hours between 02:00 and 03:00). An entry that must keep real
  spacing across the change uses ``every`` or ``"timezone": "UTC"``.

All instants returned are aware UTC datetimes; a tick's instant is also its identity (the
scheduler's idempotency key), so that identity is unique per wall-clock time.

Missed ticks (older than ``misfire_grace``: no worker ran when they came due) follow the entry's
catch-up policy, ``catch_up``: ``0`` ("none") skips them all, ``n`` runs the newest ``n`` of them
(``1`` is "latest"), ``"all"`` runs every one that came due within ``catch_up_window`` seconds
of now. Ticks within ``misfire_grace`` are on time and always run.
"""

import datetime
from dataclasses import dataclass, field
from typing import Any
from zoneinfo import ZoneInfo

from croniter import croniter

from .validation import PackageKey

UTC = datetime.UTC
# Larger than any daylight-saving shift in the tz database (2 hours, Antarctica/Troll): how far
# past a bound a search starts so that a repeated hour cannot hide a tick from it.
_DST_MARGIN = datetime.timedelta(hours=3)
_TEN_YEARS = datetime.timedelta(days=3660)


def wall_to_instant(wall, zone):
    """The UTC instant of naive local time ``wall`` in ``zone``, by the rules above: its first
    occurrence when a fall-back repeats it, the end of the gap when a spring-forward skips it."""
    first = wall.replace(tzinfo=zone, fold=0)
    instant = first.astimezone(UTC)
    if instant.astimezone(zone).replace(tzinfo=None) == wall:
        return instant
    # Inside a gap. fold=0 reads it with the offset before the jump, fold=1 with the offset after;
    # the jump lies between the two readings. Transitions fall on whole seconds: bisect to it.
    low = wall.replace(tzinfo=zone, fold=1).astimezone(UTC)  # before the jump
    high = instant  # after it
    offset_after = high.astimezone(zone).utcoffset()
    while high - low > datetime.timedelta(seconds=1):
        middle = (low + (high - low) // 2).replace(microsecond=0)
        if middle.astimezone(zone).utcoffset() == offset_after:
            high = middle
        else:
            low = middle
    return high


CATCH_UP_ALL = "all"
# The policies by name; an integer n (the newest n missed ticks) is accepted as well.
CATCH_UP_POLICIES = {"none": 0, "latest": 1, CATCH_UP_ALL: CATCH_UP_ALL}
DEFAULT_CATCH_UP_WINDOW = 86400.0  # seconds: how far back "all" reaches unless told


@dataclass(frozen=True)
class Due:
    """A pass's plan: the ticks to enqueue (oldest first), the missed ticks it skips (oldest
    first, at most the pass's ``count_limit``), how many those are, and the new ``last_tick``
    (``None``: leave it)."""

    ticks: list
    missed: list
    skipped: int
    advance_to: datetime.datetime | None


@dataclass(frozen=True)
class Schedule:
    """One ``DBQUEUE["SCHEDULE"]`` entry, validated (see ``scheduler.parse_entry``)."""

    name: str
    type: str
    payload: Any = field(default_factory=dict)
    queue: str | None = None
    priority: int | None = None
    cron: str | None = None
    every: float | None = None
    catch_up: int | str = 1  # how many missed ticks run: a count, or "all" (within the window)
    misfire_grace: float = 60.0
    timezone: str | None = None  # the cron zone; None is UTC
    catch_up_window: float = DEFAULT_CATCH_UP_WINDOW  # seconds, for catch_up="all"

    def _zone(self):
        return ZoneInfo(self.timezone or "UTC")

    def _wall(self, instant):
        return instant.astimezone(self._zone()).replace(tzinfo=None)

    def ticks_between(self, start, end, limit):
        """Ticks ``t`` with ``start < t <= end``, oldest first, at most ``limit``."""
        ticks = []
        if self.every is not None:
            step = self.every
            moment = (int(start.timestamp() // step) + 1) * step
            while moment <= end.timestamp() and len(ticks) < limit:
                ticks.append(datetime.datetime.fromtimestamp(moment, UTC))
                moment += step
            return ticks
        zone = self._zone()
        # Wall-clock times map to instants in order (a repeated time maps to its first
        # occurrence, a skipped one to the end of its gap), so walking forward from the wall
        # time of ``start`` and stopping at the first instant past ``end`` misses nothing.
        walls = croniter(self.cron, self._wall(start))
        while len(ticks) < limit:
            tick = wall_to_instant(walls.get_next(datetime.datetime), zone)
            if tick > end:
                break
            if tick > start and (not ticks or tick != ticks[-1]):
                ticks.append(tick)
        return ticks

    def ticks_before(self, end, count, after):
        """The ``count`` most recent ticks ``t`` with ``after < t <= end``, oldest first."""
        if count <= 0:
            return []
        if self.every is not None:
            last = int(end.timestamp() // self.every) * self.every
            ticks = [last - i * self.every for i in range(count)]
            return [
                datetime.datetime.fromtimestamp(t, UTC)
                for t in reversed(ticks)
                if t > after.timestamp()
            ]
        zone = self._zone()
        # Start past ``end``: when ``end`` falls in the second pass of a repeated hour, the
        # wall-clock times just after its own ran (at their first occurrence) before it.
        walls = croniter(self.cron, self._wall(end + _DST_MARGIN))
        ticks = []
        while len(ticks) < count:
            tick = wall_to_instant(walls.get_prev(datetime.datetime), zone)
            if tick <= after:
                break
            if tick <= end and (not ticks or tick != ticks[-1]):
                ticks.append(tick)
        return list(reversed(ticks))

    def due(self, last_tick, now, *, limit, count_limit):
        """What a pass at ``now`` runs when the last tick enqueued was ``last_tick``: a
        :class:`Due`. Ticks within ``misfire_grace`` of ``now`` are on time and all run (at most
        ``limit``); older, missed ones follow ``catch_up``, and the rest are skipped (counted up
        to ``count_limit``)."""
        horizon = now - datetime.timedelta(seconds=self.misfire_grace)
        on_time = self.ticks_between(max(last_tick, horizon), now, limit)
        if last_tick >= horizon:
            return Due(on_time, [], 0, on_time[-1] if on_time else None)
        if self.catch_up == CATCH_UP_ALL:
            window_start = now - datetime.timedelta(seconds=self.catch_up_window)
            start = min(max(last_tick, window_start), horizon)
            late = self.ticks_between(start, horizon, limit)
            skipped = self.ticks_between(last_tick, start, count_limit)
            if len(late) >= limit:  # more to catch up than one pass runs: the rest next pass
                return Due(late, skipped, len(skipped), late[-1])
        else:
            late = self.ticks_before(horizon, self.catch_up, last_tick)
            # Skipped: the missed ticks older than the oldest that runs (all of them, if none).
            end = late[0] - datetime.timedelta(microseconds=1) if late else horizon
            skipped = self.ticks_between(last_tick, end, count_limit) if end > last_tick else []
        ticks = late + on_time
        return Due(ticks, skipped, len(skipped), ticks[-1] if ticks else horizon)

    def next_tick(self, after):
        """The first tick after ``after``, or ``None`` within ten years."""
        ticks = self.ticks_between(after, after + _TEN_YEARS, 1)
        return ticks[0] if ticks else None

    def key(self, tick):
        """The idempotency key of the job for ``tick``: one job per tick, whichever worker."""
        return PackageKey(f"dbqueue-schedule:{self.name}:{tick.astimezone(UTC).isoformat()}")
