"""The schedule (L4): how an op is to be executed, as data attached to the op.

A schedule is the `schedule` attribute of a tracea op, a dictionary such as

    schedule = {tile = array<i64: 128, 128, 32>, warp_tile = array<i64: 64, 64, 32>,
                stages = 3 : i64, swizzle = {kind = "xor", bits = 3, base = 3, shift = 3},
                lane_map = {kind = "mma_sync", shape = array<i64: 16, 8, 16>},
                barrier = "producer_consumer"}

Every key is optional. Passes read it, the tuner writes it, the cache stores it.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields

import mlir.ir as ir

from ..errors import OpError

BARRIER_MODES = ("none", "producer_consumer", "pingpong")
# How a GEMM's epilogue reaches C: each thread stores its accumulators' pairs ("registers"), or
# (sm_90a) the warpgroup stages them in swizzled shared memory that TMA copies out ("tma")
STORE_MODES = ("registers", "tma")

# Shapes each matrix-instruction lane mapping accepts, (m, n, k).
_MMA_SYNC_SHAPES = {(16, 8, 16), (16, 8, 8)}
_MFMA_SHAPES = {(32, 32, 8), (16, 16, 16), (32, 32, 16), (16, 16, 32)}
LANE_MAP_KINDS = ("scalar", "simd", "simt", "mma_sync", "wgmma", "mfma", "simdgroup")


@dataclass(frozen=True)
class Swizzle:
    """Shared-memory address swizzle. `xor` is CUTLASS's Swizzle<bits, base, shift>: the
    `bits` bits at position base+shift of an address are XORed into the bits at `base`."""

    kind: str = "none"
    bits: int = 0
    base: int = 0
    shift: int = 0

    @staticmethod
    def xor(bits: int, base: int, shift: int) -> "Swizzle":
        return Swizzle("xor", bits, base, shift)

    def validate(self) -> None:
        if self.kind not in ("none", "xor"):
            raise OpError(f"swizzle kind must be 'none' or 'xor', got '{self.kind}'")
        if self.kind == "none":
            if (self.bits, self.base, self.shift) != (0, 0, 0):
                raise OpError("swizzle 'none' takes no bits/base/shift")
            return
        if self.bits < 1 or self.base < 0 or self.shift < self.bits:
            raise OpError(
                f"xor swizzle needs bits >= 1, base >= 0 and shift >= bits (so the XORed bit "
                f"ranges do not overlap); got bits={self.bits} base={self.base} shift={self.shift}")

    def apply(self, offset: int) -> int:
        """The swizzled element offset (the layout function the passes and analyzers share)."""
        if self.kind == "none":
            return offset
        mask = ((1 << self.bits) - 1) << (self.base + self.shift)
        return offset ^ ((offset & mask) >> self.shift)


@dataclass(frozen=True)
class LaneMap:
    """Which hardware instruction or SIMD shape the innermost tile maps onto."""

    kind: str
    shape: tuple[int, ...] = ()

    def validate(self) -> None:
        if self.kind not in LANE_MAP_KINDS:
            raise OpError(f"lane_map kind must be one of {', '.join(LANE_MAP_KINDS)}; got '{self.kind}'")
        shape = tuple(self.shape)
        if any(s <= 0 for s in shape):
            raise OpError(f"lane_map shape entries must be positive, got {list(shape)}")
        if self.kind == "mma_sync" and shape not in _MMA_SYNC_SHAPES:
            raise OpError(f"mma_sync lane_map shape must be one of m16n8k16, m16n8k8; got {list(shape)}")
        if self.kind == "wgmma" and not (
                len(shape) == 3 and shape[0] == 64 and shape[1] % 8 == 0 and 8 <= shape[1] <= 256
                and shape[2] in (8, 16, 32)):
            raise OpError(f"wgmma lane_map shape must be [64, N, K] with N a multiple of 8 in "
                          f"8..256 and K in 8, 16, 32; got {list(shape)}")
        if self.kind == "mfma" and shape not in _MFMA_SHAPES:
            raise OpError(f"mfma lane_map shape must be one of {sorted(_MFMA_SHAPES)}; got {list(shape)}")
        if self.kind == "simd" and len(shape) not in (1, 2):
            raise OpError(f"simd lane_map shape is [lanes] or [rows, lanes]; got {list(shape)}")


@dataclass(frozen=True)
class Schedule:
    """Tiles, pipelining, swizzle, lane mapping and barriers for one op."""

    tile: tuple[int, ...] | None = None  # block / cache level tile
    warp_tile: tuple[int, ...] | None = None  # warp / register level tile
    stages: int = 1  # pipeline depth (multi-buffering)
    swizzle: Swizzle = field(default_factory=Swizzle)
    lane_map: LaneMap | None = None
    barrier: str = "none"
    persistent: int = 0  # NVIDIA sm_90a: this many blocks loop over the output tiles (132: an H100 SXM's SMs)
    # NVIDIA GEMM / conv: output tiles run in groups of this many tile rows, for L2 reuse; 0: the default (8)
    group_m: int = 0
    # NVIDIA sm_90a GEMM: blocks per cluster (0 or 1: none; 2: pairs of tile rows share each B tile,
    # each block copying half of it into both by TMA multicast)
    cluster: int = 0
    store: str = "registers"  # one of STORE_MODES
    # CPU: 1 runs the kernel on the calling thread alone (a small op loses more to waking the
    # team than it gains from it); 0: on the program's thread team
    threads: int = 0

    def validate(self) -> None:
        for name in ("tile", "warp_tile"):
            value = getattr(self, name)
            if value is not None and (len(value) == 0 or any(v <= 0 for v in value)):
                raise OpError(f"schedule {name} entries must be positive, got {list(value)}")
        if self.tile is not None and self.warp_tile is not None:
            if len(self.tile) != len(self.warp_tile):
                raise OpError(f"schedule warp_tile {list(self.warp_tile)} must have as many entries "
                              f"as tile {list(self.tile)}")
            for t, w in zip(self.tile, self.warp_tile):
                if t % w:
                    raise OpError(f"schedule warp_tile {list(self.warp_tile)} must divide tile "
                                  f"{list(self.tile)} entry by entry")
        if self.stages < 1:
            raise OpError(f"schedule stages must be >= 1, got {self.stages}")
        if self.persistent < 0:
            raise OpError(f"schedule persistent (blocks) must be >= 0, got {self.persistent}")
        if self.group_m < 0:
            raise OpError(f"schedule group_m (tile rows per launch group) must be >= 0, got {self.group_m}")
        if self.cluster not in (0, 1, 2):
            raise OpError(f"schedule cluster (blocks per cluster) must be 0, 1 or 2, got {self.cluster}")
        if self.threads < 0:
            raise OpError(f"schedule threads must be >= 0 (0: the program's threads), got {self.threads}")
        if self.store not in STORE_MODES:
            raise OpError(f"schedule store must be one of {', '.join(STORE_MODES)}; got '{self.store}'")
        if self.barrier not in BARRIER_MODES:
            raise OpError(f"schedule barrier must be one of {', '.join(BARRIER_MODES)}; got '{self.barrier}'")
        if self.barrier == "producer_consumer" and self.stages < 2:
            raise OpError("schedule barrier 'producer_consumer' needs stages >= 2 "
                          "(a producer must be able to fill one buffer while another is read)")
        if self.barrier == "pingpong" and self.stages < 2:
            raise OpError("schedule barrier 'pingpong' needs stages >= 2 (a warpgroup's turn must not wait for a "
                          "buffer only the next turn releases)")
        self.swizzle.validate()
        if self.lane_map is not None:
            self.lane_map.validate()

    def as_dict(self) -> dict:
        """The fields that differ from the defaults, as plain values (the attribute's keys)."""
        out = {}
        for name in self.__dataclass_fields__:
            value, default = getattr(self, name), getattr(Schedule(), name)
            if value != default:
                out[name] = list(value) if isinstance(value, tuple) else \
                    {"kind": value.kind, "shape": list(value.shape)} if isinstance(value, LaneMap) else \
                    {k: getattr(value, k) for k in ("kind", "bits", "base", "shift")} if isinstance(value, Swizzle) \
                    else value
        return out

    @staticmethod
    def from_dict(values: dict) -> "Schedule":
        """The inverse of as_dict (what the tuning cache stores), validated."""
        fields_ = dict(values)
        for name in ("tile", "warp_tile"):
            if name in fields_:
                fields_[name] = tuple(fields_[name])
        if "lane_map" in fields_:
            fields_["lane_map"] = LaneMap(fields_["lane_map"]["kind"], tuple(fields_["lane_map"]["shape"]))
        if "swizzle" in fields_:
            fields_["swizzle"] = Swizzle(**fields_["swizzle"])
        try:
            schedule = Schedule(**fields_)
        except TypeError as e:
            raise OpError(f"not a schedule: {values!r} ({e})") from None
        schedule.validate()
        return schedule

    # --- attribute form -------------------------------------------------------------
    def to_attr(self) -> ir.Attribute:
        self.validate()
        entries: dict[str, ir.Attribute] = {}
        if self.tile is not None:
            entries["tile"] = ir.DenseI64ArrayAttr.get(list(self.tile))
        if self.warp_tile is not None:
            entries["warp_tile"] = ir.DenseI64ArrayAttr.get(list(self.warp_tile))
        if self.stages != 1:
            entries["stages"] = _i64(self.stages)
        if self.swizzle.kind != "none":
            s = self.swizzle
            entries["swizzle"] = ir.DictAttr.get({
                "kind": ir.StringAttr.get(s.kind), "bits": _i64(s.bits),
                "base": _i64(s.base), "shift": _i64(s.shift)})
        if self.lane_map is not None:
            entries["lane_map"] = ir.DictAttr.get({
                "kind": ir.StringAttr.get(self.lane_map.kind),
                "shape": ir.DenseI64ArrayAttr.get(list(self.lane_map.shape))})
        if self.barrier != "none":
            entries["barrier"] = ir.StringAttr.get(self.barrier)
        if self.persistent:
            entries["persistent"] = _i64(self.persistent)
        if self.group_m:
            entries["group_m"] = _i64(self.group_m)
        if self.cluster:
            entries["cluster"] = _i64(self.cluster)
        if self.store != "registers":
            entries["store"] = ir.StringAttr.get(self.store)
        if self.threads:
            entries["threads"] = _i64(self.threads)
        return ir.DictAttr.get(entries)

    @staticmethod
    def from_attr(attr: ir.Attribute) -> "Schedule":
        """Decode and validate; errors name the offending key."""
        if not isinstance(attr, ir.DictAttr):
            raise OpError(f"attribute 'schedule' must be a dictionary, got {attr}")
        known = {f.name for f in fields(Schedule)}
        values: dict = {}
        for i in range(len(attr)):
            named = attr[i]
            key, value = named.name, named.attr
            if key not in known:
                raise OpError(f"schedule has unknown key '{key}'; known keys: {', '.join(sorted(known))}")
            where = f"schedule {key}"
            if key in ("tile", "warp_tile"):
                values[key] = tuple(decode_ints(value, where))
            elif key == "stages":
                values[key] = decode_int(value, where)
            elif key in ("barrier", "store"):
                values[key] = decode_str(value, where)
            elif key in ("persistent", "group_m", "cluster", "threads"):
                values[key] = decode_int(value, where)
            elif key == "swizzle":
                values[key] = _decode_swizzle(value)
            elif key == "lane_map":
                values[key] = _decode_lane_map(value)
        schedule = Schedule(**values)
        schedule.validate()
        return schedule


def _decode_swizzle(attr: ir.Attribute) -> Swizzle:
    if isinstance(attr, ir.StringAttr) and attr.value == "none":
        return Swizzle()
    d = _dict(attr, "schedule swizzle", {"kind", "bits", "base", "shift"})
    return Swizzle(decode_str(d.get("kind"), "swizzle kind"),
                   *(decode_int(d.get(k), f"swizzle {k}") if k in d else 0 for k in ("bits", "base", "shift")))


def _decode_lane_map(attr: ir.Attribute) -> LaneMap:
    d = _dict(attr, "schedule lane_map", {"kind", "shape"})
    shape = tuple(decode_ints(d["shape"], "lane_map shape")) if "shape" in d else ()
    return LaneMap(decode_str(d.get("kind"), "lane_map kind"), shape)


# --- small attribute decoders shared with the op definitions --------------------------
def _i64(value: int) -> ir.Attribute:
    return ir.IntegerAttr.get(ir.IntegerType.get_signless(64), value)


def _dict(attr: ir.Attribute, where: str, keys: set[str]) -> dict[str, ir.Attribute]:
    if not isinstance(attr, ir.DictAttr):
        raise OpError(f"{where} must be a dictionary, got {attr}")
    out = {attr[i].name: attr[i].attr for i in range(len(attr))}
    unknown = set(out) - keys
    if unknown:
        raise OpError(f"{where} has unknown key(s) {', '.join(sorted(unknown))}; known: {', '.join(sorted(keys))}")
    return out


def decode_int(attr: ir.Attribute | None, where: str) -> int:
    if not isinstance(attr, ir.IntegerAttr) or isinstance(attr, ir.BoolAttr):
        raise OpError(f"{where} must be an integer, got {attr}")
    return attr.value


def decode_ints(attr: ir.Attribute | None, where: str) -> list[int]:
    if isinstance(attr, ir.DenseI64ArrayAttr):
        return list(attr)
    if isinstance(attr, ir.ArrayAttr):
        return [decode_int(a, where) for a in attr]
    raise OpError(f"{where} must be an integer array (e.g. array<i64: 1, 2>), got {attr}")


def decode_str(attr: ir.Attribute | None, where: str) -> str:
    if not isinstance(attr, ir.StringAttr):
        raise OpError(f"{where} must be a string, got {attr}")
    return attr.value


def decode_bool(attr: ir.Attribute | None, where: str) -> bool:
    if not isinstance(attr, ir.BoolAttr):
        raise OpError(f"{where} must be true or false, got {attr}")
    return attr.value


def decode_float(attr: ir.Attribute | None, where: str) -> float:
    if isinstance(attr, ir.FloatAttr):
        return attr.value
    if isinstance(attr, ir.IntegerAttr) and not isinstance(attr, ir.BoolAttr):
        return float(attr.value)
    raise OpError(f"{where} must be a number, got {attr}")
