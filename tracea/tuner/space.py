"""SearchSpace: the schedules a tuner may try for one op, as named knobs with lists of choices,
pruned by constraints before anything is compiled.

    space = (SearchSpace().tile_m([64, 128]).tile_n([64, 128]).tile_k([32]).stages([2, 3])
             .swizzles(["none", Swizzle.xor(3, 3, 3)]).barrier_modes(["none", "producer_consumer"]))

A configuration is a dict {knob: choice}; `schedule(config)` turns it into the op's Schedule
(tile = [tile_m, tile_n(, tile_k)], warp_tile = [warp_m, warp_n(, warp_k)], ...), so the
knobs of every backend are the schedule's own fields. Configurations whose schedules coincide
are one (the first in enumeration order is kept), and a constraint that fails drops a
configuration with its reason (`pruned()`), so a space can be written generously.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from ..dialects.schedule import LaneMap, Schedule, Swizzle
from ..errors import OpError, TraceaError

# knob -> how it enters the Schedule: the position in tile / warp_tile, or the field it sets
_TILE = {"tile_m": 0, "tile_n": 1, "tile_k": 2}
_WARP = {"warp_m": 0, "warp_n": 1, "warp_k": 2}
_FIELDS = {"tile": "tile", "warp_tile": "warp_tile", "stages": "stages", "swizzle": "swizzle", "barrier": "barrier", "persistent": "persistent",
           "group_m": "group_m", "cluster": "cluster", "store": "store", "threads": "threads"}


class SpaceError(TraceaError, ValueError):
    """A search space that cannot be built or has no configuration left."""


@dataclass
class SearchSpace:
    knobs: dict[str, list] = field(default_factory=dict)
    constraints: list[tuple[str, Callable[[dict, Schedule], bool]]] = field(default_factory=list)
    # the schedule every configuration starts from (lane_map, fields no knob sets)
    base: Schedule = field(default_factory=Schedule)
    # normalizes a built schedule (e.g. rounds a cache block to a multiple of the register tile)
    adjust: Callable[[Schedule], Schedule] | None = None

    # --- building (the seed's builder, Pythonic names) ------------------------------------
    def knob(self, name: str, choices) -> "SearchSpace":
        choices = list(choices)
        if not choices:
            raise SpaceError(f"knob {name!r} needs at least one choice")
        if name not in _TILE and name not in _WARP and name not in _FIELDS:
            raise SpaceError(f"unknown knob {name!r}; knobs: {', '.join([*_TILE, *_WARP, *_FIELDS])}")
        self.knobs[name] = choices
        return self

    def tile_m(self, choices) -> "SearchSpace":
        return self.knob("tile_m", choices)

    def tile_n(self, choices) -> "SearchSpace":
        return self.knob("tile_n", choices)

    def tile_k(self, choices) -> "SearchSpace":
        return self.knob("tile_k", choices)

    def warp_m(self, choices) -> "SearchSpace":
        return self.knob("warp_m", choices)

    def warp_n(self, choices) -> "SearchSpace":
        return self.knob("warp_n", choices)

    def warp_k(self, choices) -> "SearchSpace":
        return self.knob("warp_k", choices)

    def stages(self, choices) -> "SearchSpace":
        return self.knob("stages", choices)

    def swizzles(self, choices) -> "SearchSpace":
        """Swizzles as Swizzle values or their text ("none", "xor3.3.3": bits, base, shift)."""
        return self.knob("swizzle", [_text(c) if isinstance(c, Swizzle) else c or "none" for c in choices])

    def barrier_modes(self, choices) -> "SearchSpace":
        return self.knob("barrier", choices)

    def threads(self, choices) -> "SearchSpace":
        """CPU: 1 (the calling thread alone) or the program's threads."""
        return self.knob("threads", choices)

    def lanes(self, lanes: int) -> "SearchSpace":
        """Every schedule on SIMD vectors of `lanes` lanes (the CPU kernels' lane_map)."""
        self.base = replace(self.base, lane_map=LaneMap("simd", (lanes,)))
        return self

    def constrain(self, why: str, holds: Callable[[dict, Schedule], bool]) -> "SearchSpace":
        """Drop configurations for which `holds(config, schedule)` is False; `why` names the rule."""
        self.constraints.append((why, holds))
        return self

    def include(self, schedule: Schedule | None) -> "SearchSpace":
        """Add `schedule`'s own values to the knobs' choices (the variant's default belongs in
        its space: the search starts there)."""
        if schedule is None:
            return self
        for name, choices in self.knobs.items():
            value = _value(schedule, name)
            if value is None or value in choices:
                continue
            choices.append(value)
            if all(isinstance(c, (int, float)) for c in choices):
                choices.sort()
        return self

    # --- using ----------------------------------------------------------------------------
    def schedule(self, config: dict) -> Schedule:
        tile, warp, values = {}, {}, {}
        for name, choice in config.items():
            if name in _TILE:
                tile[_TILE[name]] = choice
            elif name in _WARP:
                warp[_WARP[name]] = choice
            elif name == "swizzle":
                values["swizzle"] = _swizzle(choice)
            else:  # JSON gives tuples back as lists
                values[_FIELDS[name]] = tuple(choice) if isinstance(choice, list) else choice
        base = self.base
        if tile:
            values["tile"] = _merge(values.get("tile", base.tile), tile, "tile")
        if warp:
            values["warp_tile"] = _merge(values.get("warp_tile", base.warp_tile), warp, "warp_tile")
        schedule = replace(base, **values)
        return self.adjust(schedule) if self.adjust else schedule

    def _walk(self):
        """(config, schedule or None, why-pruned or None) for every combination, in order."""
        names = list(self.knobs)
        seen: set[Schedule] = set()
        for choices in itertools.product(*(self.knobs[n] for n in names)):
            config = dict(zip(names, choices))
            try:
                schedule = self.schedule(config)
                schedule.validate()
            except OpError as e:
                yield config, None, str(e)
                continue
            why = next((why for why, holds in self.constraints if not holds(config, schedule)), None)
            if why is None and schedule in seen:
                why = "the same schedule as an earlier configuration"
            if why is None:
                seen.add(schedule)
            yield config, schedule, why

    def configurations(self) -> list[dict]:
        """The configurations left after pruning, in enumeration order (deterministic)."""
        found = [config for config, _, why in self._walk() if why is None]
        if not found:
            raise SpaceError(f"every configuration of {self.describe()} is pruned; first reasons: "
                             + "; ".join(sorted({why for _, _, why in itertools.islice(self._walk(), 50)})))
        return found

    def pruned(self) -> list[tuple[dict, str]]:
        return [(config, why) for config, _, why in self._walk() if why is not None]

    def size(self) -> int:
        return math.prod(len(c) for c in self.knobs.values())

    def encode(self, config: dict) -> list[float]:
        """The configuration as a point of [0, 1]^knobs for the GP: a numeric knob by the log
        of its value (tile sizes act multiplicatively), scaled over its choices' range; any
        other knob by its choice's position."""
        point = []
        for name, choices in self.knobs.items():
            value = config[name]
            if all(isinstance(c, (int, float)) and not isinstance(c, bool) and c > 0 for c in choices):
                lo, hi = math.log(min(choices)), math.log(max(choices))
                point.append(0.0 if hi == lo else (math.log(value) - lo) / (hi - lo))
            else:
                point.append(0.0 if len(choices) == 1 else choices.index(value) / (len(choices) - 1))
        return point

    def describe(self) -> str:
        return "SearchSpace(" + ", ".join(f"{n}={v}" for n, v in self.knobs.items()) + ")"


def _value(schedule: Schedule, knob: str):
    """The value `knob` has in `schedule`, or None."""
    if knob in _TILE or knob in _WARP:
        tiles = schedule.tile if knob in _TILE else schedule.warp_tile
        index = _TILE.get(knob, _WARP.get(knob))
        return tiles[index] if tiles is not None and index < len(tiles) else None
    value = getattr(schedule, _FIELDS[knob])
    return _text(value) if isinstance(value, Swizzle) else value


def _merge(base: tuple[int, ...] | None, entries: dict[int, int], name: str) -> tuple[int, ...]:
    length = max(max(entries) + 1, len(base or ()))
    merged = list(base or ()) + [None] * (length - len(base or ()))
    for i, v in entries.items():
        merged[i] = v
    if None in merged:
        raise SpaceError(f"the space sets {name} entries {sorted(entries)} but not all of 0..{length - 1} "
                         "(give the rest knobs or a base schedule)")
    return tuple(merged)


def _swizzle(text: str) -> Swizzle:
    if text == "none":
        return Swizzle()
    try:
        bits, base, shift = (int(x) for x in text.removeprefix("xor").split("."))
    except ValueError:
        raise SpaceError(f"swizzle {text!r} is not 'none' or 'xor<bits>.<base>.<shift>'") from None
    return Swizzle.xor(bits, base, shift)


def config_key(config: dict) -> str:
    """A configuration as stable text (the tuning cache's per-configuration key)."""
    return ",".join(f"{k}={_text(v)}" for k, v in sorted(config.items()))


def _text(value: Any) -> str:
    if isinstance(value, Swizzle):
        return "none" if value.kind == "none" else f"xor{value.bits}.{value.base}.{value.shift}"
    if isinstance(value, (list, tuple)):
        return "x".join(str(v) for v in value)
    return str(value)
