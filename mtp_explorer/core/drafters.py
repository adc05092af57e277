"""The drafter registry: one record per drafter the engine has, and the ``drafter=`` choices built from them.

A :class:`DrafterSpec` says everything the rest of the package asks about a drafter: its engine name
(the ``drafter`` column indexes :data:`~mtp_explorer.core.schema.DRAFTERS`, and so does the drafter axis of
the per-drafter oracle columns ``draft``, ``draft_len``, ...), which is its llama.cpp ``--spec-type`` name, a
label for views, its traits as the engine's drafter table declares them (:data:`TRAITS`: whether it has a
confidence, so that ``p_min`` applies, what it needs), its options with llama.cpp's flags and defaults (the engine
takes them by keyword, in ``GenerationConfig.options``), and the name of its replay in the simulator.
A :class:`DrafterMode` is what ``Session.generate(drafter=...)`` takes: one drafter, or a chain of them
with a policy. Views, the what-if panel, sweeps, calibration and the CLI read these records instead of
comparing names; adding a drafter means adding its record here (and its class in ``native_ext/``).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from typing import Any

from . import native
from .errors import ParameterError
from .schema import CHAIN_POLICIES, DRAFTERS

#: What a drafter may need besides the target model (the engine's DrafterNeeds): nothing (a look-up), the model's
#: MTP head, a separate draft model (``Session.open(path, draft_model=...)``, llama.cpp's ``-md``), or a head given
#: the same way that reads the target's layers (an ``eagle3`` GGUF: an EAGLE-3 head; a ``dflash`` GGUF: a DFlash block
#: drafter, or a DSpark one when llama.cpp's DSpark converter wrote it). The last four are the kinds of draft model a
#: session can hold (``Session.draft_kind``).
NEEDS: tuple[str, ...] = tuple(native.DRAFTER_NEEDS_KINDS)
#: The needs a draft model file serves: what ``Session.draft_kind`` says the session's draft model is.
DRAFT_KINDS: tuple[str, ...] = tuple(native.DRAFT_FILE_KINDS)
#: Each engine drafter's traits, by name, as the engine's drafter table declares them (``native_ext/drafters.cpp``):
#: ``needs`` (an entry of :data:`NEEDS`), ``has_confidence``, ``snapshot_slots``, ``draft_file``.
TRAITS: Mapping[str, Mapping[str, Any]] = {t["name"]: t for t in native.DRAFTER_TRAITS}
#: How messages name each kind of draft model.
DRAFT_KIND_LABELS: Mapping[str, str] = {
    "draft_model": "draft model that drafts alone",
    "eagle3_head": "EAGLE-3 head",
    "dflash_head": "DFlash head",
    "dspark_head": "DSpark head",
    "nothing": "no draft model",
}


def draft_kind(has_draft_model: bool | str) -> str:
    """The kind of draft model a session has: ``has_draft_model`` is a kind of :data:`DRAFT_KINDS`, ``True`` (a draft
    model, the kind every drafter before ``draft-eagle3`` took) or ``False`` / ``"nothing"`` (none)."""
    if has_draft_model is True:
        return DRAFT_KINDS[0]
    if not has_draft_model or has_draft_model == NEEDS[0]:
        return NEEDS[0]
    if has_draft_model not in DRAFT_KINDS:
        raise ParameterError(f"a draft model is one of {DRAFT_KINDS}, got {has_draft_model!r}")
    return str(has_draft_model)


@dataclasses.dataclass(frozen=True)
class DrafterOption:
    """One option of a drafter: the keyword argument, llama.cpp's flag and default, its range; or, for a file
    option (:meth:`path`, ``is_path``), a file name (``""``: none), which the engine reads when a generation begins."""

    name: str  #: keyword argument of Session.generate / sweep, llama.cpp's flag without ``--spec-`` (e.g.
    #: ``ngram_simple_size_n``); also its key in the engine's ``GenerationConfig.options``
    flag: str  #: llama.cpp's command-line flag, e.g. ``--spec-ngram-simple-size-n``
    default: int | str
    lo: int
    hi: int
    help: str
    aliases: tuple[str, ...] = ()  #: earlier keyword names that still work (e.g. ``ngram_n``)
    is_path: bool = False  #: a file name (a ``str`` or path-like), not an integer

    @classmethod
    def path(cls, name: str, flag: str, help: str) -> DrafterOption:
        """A file option: ``name``, llama.cpp's ``flag``, no file by default."""
        return cls(name, flag, "", 0, 0, help, is_path=True)

    def check(self, value: Any) -> int | str:
        """``value`` if it is an integer in range (a file option: a file name, as ``str``), else a
        :class:`ParameterError` naming the range. Whether the file can be read is checked when it is read."""
        if self.is_path:
            if not isinstance(value, (str, os.PathLike)) or not isinstance(os.fspath(value), str):
                raise ParameterError(f"{self.name} ({self.flag}) must be a file name (str or path), got {value!r}")
            return os.fspath(value)
        if not isinstance(value, int) or isinstance(value, bool) or not self.lo <= value <= self.hi:
            raise ParameterError(
                f"{self.name} ({self.flag}) must be an integer in [{self.lo}, {self.hi}], got {value!r}"
            )
        return value


@dataclasses.dataclass(frozen=True)
class DrafterSpec:
    """What the package knows of one drafter."""

    name: str  #: llama.cpp's ``--spec-type`` value, the engine's name (an entry of DRAFTERS)
    label: str  #: how views name it
    options: tuple[DrafterOption, ...] = ()
    replay: str = ""  #: the class name of its replay in the simulator (:func:`register_replays` makes it known)
    description: str = ""
    fixed_draft_len: int = (
        0  #: llama.cpp's draft length when no option sets it (ngram-cache's n_draft 8); 0: an option does
    )
    #: what a llama-server keeps of it from one request to the next ('': nothing), which a replay of each request from
    #: its own prompt does not see (common/speculative.cpp 0.3.36)
    server_carry: str = ""

    @property
    def has_confidence(self) -> bool:
        """Its drafts carry a confidence, so ``p_min`` applies and calibration exists (the engine's table says)."""
        return bool(TRAITS[self.name]["has_confidence"])

    @property
    def needs(self) -> str:
        """What it drafts with besides the history (an entry of :data:`NEEDS`; the engine's table says)."""
        return str(TRAITS[self.name]["needs"])

    @property
    def needs_mtp(self) -> bool:
        """It drafts with the model's MTP (nextn) layers."""
        return self.needs == "mtp"

    @property
    def needs_draft_model(self) -> bool:
        """It drafts with a model file of its own (a draft model or an EAGLE-3 head: llama.cpp's ``-md``)."""
        return bool(TRAITS[self.name]["draft_file"])

    @property
    def gets_snapshot_slots(self) -> bool:
        """llama.cpp gives a recurrent target snapshot slots when it is in the chain (``need_n_rs_seq`` in 0.3.36's
        common.h: draft-mtp, draft-eagle3, draft-dflash, draft-dspark); without them llama-speculative-simple restores
        a checkpoint after a partial acceptance."""
        return bool(TRAITS[self.name]["snapshot_slots"])

    @property
    def is_lookup(self) -> bool:
        """It drafts from the token history alone (no model: no decode, no confidence)."""
        return self.needs == "nothing"

    def runs_with(self, has_mtp: bool, has_draft_model: bool | str = False) -> bool:
        """A session with (or without) an MTP head and a draft model of a kind (:func:`draft_kind`) can run it."""
        if self.needs in DRAFT_KINDS:
            return draft_kind(has_draft_model) == self.needs
        return {"nothing": True, "mtp": has_mtp}[self.needs]

    @property
    def index(self) -> int:
        """Its index in the ``drafter`` column and in the drafter axis of the per-drafter columns (``sources``)."""
        return DRAFTERS.index(self.name)

    def load_replay(self) -> Any:
        """The simulator's replay of this drafter: the class the analysis layer registered under :attr:`replay`."""
        try:
            return _REPLAYS[self.replay]
        except KeyError:
            raise LookupError(
                f"no replay of {self.name} is registered ({self.replay!r}): importing mtp_explorer registers them"
            ) from None


#: the simulator's replay classes by class name; the analysis layer, above this one, fills it when imported
_REPLAYS: dict[str, type] = {}


def register_replays(*classes: type) -> None:
    """Make replay classes known to the drafters whose :attr:`DrafterSpec.replay` names them."""
    _REPLAYS.update({cls.__name__: cls for cls in classes})


@dataclasses.dataclass(frozen=True)
class DrafterMode:
    """A ``drafter=`` choice: one drafter, or a chain of them verified under ``policy`` (``first``, llama.cpp's:
    the first drafter in chain order with a usable draft; ``best``: the highest expected accepted length)."""

    name: str
    drafters: tuple[DrafterSpec, ...]
    policy: str = CHAIN_POLICIES[0]
    label: str = ""
    description: str = ""

    @property
    def gets_snapshot_slots(self) -> bool:
        """llama.cpp gives a recurrent target snapshot slots for it (a drafter of it does: its ``need_n_rs_seq``);
        otherwise it restores checkpoints after a partial acceptance."""
        return any(d.gets_snapshot_slots for d in self.drafters)

    def n_rs_seq(self, n_max: int) -> int:
        """The snapshot slots llama.cpp gives a recurrent target for it at ``n_max`` (``need_n_rs_seq``: ``n_max``
        where :attr:`gets_snapshot_slots`, else 0), as llama-server opens its context."""
        return n_max if self.gets_snapshot_slots else 0

    @property
    def is_chain(self) -> bool:
        return len(self.drafters) > 1

    @property
    def needs_mtp(self) -> bool:
        """Some drafter of the mode drafts with the MTP head, so it cannot run on a model without one."""
        return any(d.needs_mtp for d in self.drafters)

    @property
    def needs_draft_model(self) -> bool:
        """Some drafter of the mode drafts with a separate draft model."""
        return any(d.needs_draft_model for d in self.drafters)

    def runs_with(self, has_mtp: bool, has_draft_model: bool | str = False) -> bool:
        """A session with (or without) an MTP head and a draft model (of a kind, :func:`draft_kind`) can draft with
        every drafter of the mode."""
        return all(d.runs_with(has_mtp, has_draft_model) for d in self.drafters)

    @property
    def has_confidence(self) -> bool:
        """``p_min`` applies to some drafter of the mode."""
        return any(d.has_confidence for d in self.drafters)

    @property
    def options(self) -> tuple[DrafterOption, ...]:
        return tuple(o for d in self.drafters for o in d.options)

    @property
    def spec_types(self) -> str:
        """The chain as llama.cpp's ``--spec-type`` value (comma-separated, in llama.cpp's order of preference,
        which :func:`mode` parses back to this choice up to its policy)."""
        named = {d.name for d in self.drafters}
        return ",".join(t for t in SPEC_TYPE_ORDER if t in named)


# llama.cpp 0.3.36's defaults (common.h, common_params_speculative_ngram_map): 12 and 48
_NGRAM_OPTIONS = (
    DrafterOption(
        "ngram_simple_size_n",
        "--spec-ngram-simple-size-n",
        12,
        1,
        1024,
        "length of the n-gram looked up (ending with the last token)",
        aliases=("ngram_n",),
    ),
    DrafterOption(
        "ngram_simple_size_m",
        "--spec-ngram-simple-size-m",
        48,
        1,
        1024,
        "length of the continuation proposed after a match (cut to n_max); below ngram_simple_size_n nothing "
        "is proposed (llama.cpp drops a continuation shorter than the n-gram)",
        aliases=("ngram_m",),
    ),
)

_NGRAM_MOD_OPTIONS = (
    DrafterOption(
        "ngram_mod_n_match",
        "--spec-ngram-mod-n-match",
        24,
        1,
        1024,
        "length of the n-gram hashed into the table (ending with the last token)",
    ),
    DrafterOption(
        "ngram_mod_n_min",
        "--spec-ngram-mod-n-min",
        48,
        0,
        1024,
        "a draft that runs out of table entries before this many tokens is dropped",
    ),
    DrafterOption("ngram_mod_n_max", "--spec-ngram-mod-n-max", 64, 0, 1024, "longest draft (then cut to n_max)"),
)


def _ngram_map_options(prefix: str, min_hits_help: str) -> tuple[DrafterOption, ...]:
    """The options of an ngram-map drafter, under its prefix (``ngram_map_k``, ``ngram_map_k4v``)."""
    flag = "--spec-" + prefix.replace("_", "-")
    return (
        DrafterOption(
            f"{prefix}_size_n",
            f"{flag}-size-n",
            12,
            1,
            1024,
            "length of the key n-gram looked up (ending with the last token)",
        ),
        DrafterOption(
            f"{prefix}_size_m",
            f"{flag}-size-m",
            48,
            1,
            1024,
            "length of the m-gram after the key proposed (cut to n_max)",
        ),
        DrafterOption(f"{prefix}_min_hits", f"{flag}-min-hits", 1, 1, 65535, min_hits_help),
    )


def _ngram_map_spec(name: str, label: str, min_hits_help: str, description: str) -> DrafterSpec:
    """An ngram-map drafter (``ngram-map-k``, ``ngram-map-k4v``): its options under its prefix, one replay."""
    return DrafterSpec(
        name,
        label,
        options=_ngram_map_options(name.replace("-", "_"), min_hits_help),
        server_carry="each slot's key map (common_ngram_map_begin keeps the keys below the new prompt's length)",
        replay="LookupReplay",
        description=description,
    )


# llama.cpp 0.3.36 (common.h, common_params_speculative_ngram_cache): no files by default; its ngram-cache reads both
# when it starts and never writes them (see native_ext/ngram_cache_drafter.h)
_NGRAM_CACHE_OPTIONS = (
    DrafterOption.path(
        "lookup_cache_static",
        "--lookup-cache-static",
        "static n-gram cache file (llama.cpp's -lcs; written by llama-lookup-create or "
        "mtp_explorer.analysis.ngram_cache.write_static_cache); its 2-gram counts weigh and back up the "
        "drafts ('': none)",
    ),
    DrafterOption.path(
        "lookup_cache_dynamic",
        "--lookup-cache-dynamic",
        "dynamic n-gram cache file (llama.cpp's -lcd, the same format), consulted under strict "
        "thresholds where the context has no draft; read only, as llama.cpp 0.3.36 ('': none)",
    ),
)

#: Every drafter of the engine, in the engine's order.
DRAFTER_SPECS: Mapping[str, DrafterSpec] = {
    s.name: s
    for s in (
        DrafterSpec(
            "draft-mtp",
            "MTP head",
            replay="MtpReplay",
            server_carry="each slot's pending hidden row (common_speculative_impl_draft_mtp::pending_h: the "
            "catch-up pairs a request's first prompt token with the last hidden row of the request "
            "the slot served before, zeros on a fresh slot; a head with memory of its own)",
            description="the model's MTP (nextn) head drafts autoregressively; confidence compared with p_min",
        ),
        DrafterSpec(
            "ngram-simple",
            "n-gram look-up",
            options=_NGRAM_OPTIONS,
            replay="NgramSimpleReplay",
            description="prompt look-up: the last ngram_simple_size_n tokens matched earlier in the context, "
            "the ngram_simple_size_m tokens that followed proposed",
        ),
        DrafterSpec(
            "ngram-mod",
            "n-gram table",
            options=_NGRAM_MOD_OPTIONS,
            replay="LookupReplay",
            server_carry="its n-gram pool, shared by the slots (begin() adds each prompt's n-grams and clears the "
            "pool only past 25% occupancy)",
            description="a hash table of the context's ngram_mod_n_match-grams and the token after each, followed "
            "from the last tokens; reset after five steps of low acceptance",
        ),
        _ngram_map_spec(
            "ngram-map-k",
            "n-gram key map",
            "unused by ngram-map-k (llama.cpp 0.3.36 ignores it)",
            "the last ngram_map_k_size_n tokens found through a hash map of the context; the tokens after the "
            "match proposed, as many as were accepted the last time this key drafted",
        ),
        _ngram_map_spec(
            "ngram-map-k4v",
            "n-gram key/value map",
            "key hits before a draft",
            "as ngram-map-k, drafting only when the key was seen min_hits times and its most frequent "
            "continuation (of up to 4) at least twice as often as the others together",
        ),
        DrafterSpec(
            "ngram-cache",
            "n-gram cache",
            options=_NGRAM_CACHE_OPTIONS,
            replay="LookupReplay",
            fixed_draft_len=8,
            server_carry="each slot's context cache (begin() does nothing: a shorter next prompt's n-grams are "
            "added only once the slot's tokens outgrow the last request's)",
            description="counts of the tokens after each 1- to 4-gram of the context (and of optional dynamic and "
            "static cache files): up to 8 tokens, each the most frequent after the longest n-gram "
            "seen often enough",
        ),
        DrafterSpec(
            "draft-simple",
            "draft model",
            replay="DraftModelReplay",
            description="a separate, smaller model with the same vocabulary (Session.open(draft_model=...), "
            "llama.cpp's -md) drafts greedily; confidence compared with p_min",
        ),
        DrafterSpec(
            "draft-eagle3",
            "EAGLE-3 head",
            replay="Eagle3Replay",
            description="a one-layer EAGLE-3 head (an eagle3 GGUF: Session.open(draft_model=...), llama.cpp's -md) "
            "reads three of the target's layers after every decode and drafts greedily from them, "
            "feeding its own hidden state forward; confidence compared with p_min",
        ),
        DrafterSpec(
            "draft-dflash",
            "DFlash block",
            replay="DFlashReplay",
            description="a DFlash block drafter (a dflash GGUF: Session.open(draft_model=...), llama.cpp's -md) "
            "reads target layers into its memory after every decode and drafts a whole block in one "
            "pass (n_max clamped to its block size - 1); confidence compared with p_min",
        ),
        DrafterSpec(
            "draft-dspark",
            "DSpark block",
            replay="DFlashReplay",
            description="a DSpark block drafter (DFlash with a Markov head chained across the block; a dflash GGUF "
            "from llama.cpp's DSpark converter) drafts a block in one pass from its first slot on; "
            "p_min is compared with its confidence head (refused without one)",
        ),
    )
}

if tuple(DRAFTER_SPECS) != DRAFTERS:  # the engine and the registry must name the same drafters
    raise ImportError(f"drafter registry {tuple(DRAFTER_SPECS)} differs from the engine's {DRAFTERS}")


def _alone(name: str) -> DrafterMode:
    """The mode of one drafter under its name, label and description."""
    spec = DRAFTER_SPECS[name]
    return DrafterMode(spec.name, (spec,), label=spec.label, description=spec.description)


def _then_mtp(name: str, label: str = "") -> DrafterMode:
    """llama.cpp's ``--spec-type <look-up>,draft-mtp``: the look-up's draft where it has one, else the MTP head's."""
    spec = DRAFTER_SPECS[name]
    return DrafterMode(
        f"{spec.name},draft-mtp",
        (spec, DRAFTER_SPECS["draft-mtp"]),
        policy="first",
        label=f"{label or spec.label}, then MTP",
        description=f"llama.cpp's --spec-type {spec.name},draft-mtp: the {spec.label}'s draft where "
        "it has one, else the MTP head's",
    )


#: The ``drafter=`` choices, by name: llama.cpp's ``--spec-type`` value of each (a chain's in llama.cpp's order of
#: preference), the one name every value, list, label, error and trace uses.
MODES: Mapping[str, DrafterMode] = {
    m.name: m
    for m in (
        DrafterMode(
            "draft-mtp", (DRAFTER_SPECS["draft-mtp"],), label="MTP", description=DRAFTER_SPECS["draft-mtp"].description
        ),
        DrafterMode(
            "ngram-simple",
            (DRAFTER_SPECS["ngram-simple"],),
            label="n-gram",
            description=DRAFTER_SPECS["ngram-simple"].description,
        ),
        _then_mtp("ngram-simple", label="n-gram"),
        _alone("ngram-mod"),
        _then_mtp("ngram-mod"),
        _alone("ngram-map-k"),
        _alone("ngram-map-k4v"),
        DrafterMode(
            "ngram-simple,ngram-map-k,draft-mtp",
            (DRAFTER_SPECS["ngram-simple"], DRAFTER_SPECS["ngram-map-k"], DRAFTER_SPECS["draft-mtp"]),
            policy="first",
            label="n-gram, key map, then MTP",
            description="llama.cpp's --spec-type ngram-simple,ngram-map-k,draft-mtp: the first of them with a draft",
        ),
        _alone("ngram-cache"),
        _then_mtp("ngram-cache"),
        _alone("draft-simple"),
        _alone("draft-eagle3"),
        _alone("draft-dflash"),
        _alone("draft-dspark"),
    )
}

DRAFTER_MODES: tuple[str, ...] = tuple(MODES)
"""The listed ``drafter=`` choices of :meth:`Session.generate`, by llama.cpp's ``--spec-type`` names (it also takes
any other ``--spec-type`` value, and the short spellings of :data:`MODE_ALIASES`)."""

#: Earlier short spellings of a choice, accepted as input only: the ``--spec-type`` value each stands for and the
#: chain policy it brings (``None``: the value's own). A settings value, a trace and every message name the value.
#: (``chain`` was both drafters asked every step, the higher expected accepted length verified.)
MODE_ALIASES: Mapping[str, tuple[str, str | None]] = {
    "mtp": ("draft-mtp", None),
    "ngram": ("ngram-simple", None),
    "chain": ("ngram-simple,draft-mtp", "best"),
}

DRAFT_MTP = "draft-mtp"  #: llama.cpp's spec type of the model's own MTP head (its drafter in the ``drafter`` column)
NGRAM_SIMPLE = "ngram-simple"  #: llama.cpp's spec type of the simple n-gram look-up (llama-server sizes its drafts)
DEFAULT_MODE: str = DRAFT_MTP

#: llama.cpp 0.3.36's ``--spec-type`` names (common/speculative.cpp) in its order of preference: a chain's
#: drafters are asked in this order whatever order the value names them in (common_speculative_init).
SPEC_TYPE_ORDER: tuple[str, ...] = (
    "ngram-simple",
    "ngram-map-k",
    "ngram-map-k4v",
    "ngram-mod",
    "ngram-cache",
    "draft-simple",
    "draft-eagle3",
    "draft-mtp",
    "draft-dflash",
    "draft-dspark",
)
_SPEC_TYPE_NONE = "none"
if set(SPEC_TYPE_ORDER) != {s.name for s in DRAFTER_SPECS.values()}:  # every llama.cpp type, and only those
    raise ImportError(
        f"--spec-type order {SPEC_TYPE_ORDER} differs from the registry's "
        f"{sorted(s.name for s in DRAFTER_SPECS.values())}"
    )


def _unalias(name: str) -> str:
    """A short spelling of one drafter (``mtp``, ``ngram``) as its ``--spec-type`` name; any other name as given."""
    alias = MODE_ALIASES.get(name) if isinstance(name, str) else None
    return alias[0] if alias is not None and "," not in alias[0] else name


def drafter(name: str) -> DrafterSpec:
    """The record of an engine drafter by name (llama.cpp's ``--spec-type`` value; the short spellings ``mtp`` and
    ``ngram`` of :data:`MODE_ALIASES` are taken as input too)."""
    try:
        return DRAFTER_SPECS[_unalias(name)]
    except KeyError:
        raise ParameterError(f"unknown drafter {name!r}; the engine has {', '.join(DRAFTERS)}") from None


def mode(name: str | Sequence[str] | DrafterMode, policy: str | None = None) -> DrafterMode:
    """The ``drafter=`` choice: a :class:`DrafterMode` (passes through), llama.cpp's ``--spec-type`` value (a listed
    one of :data:`DRAFTER_MODES`, ``"draft-mtp"``, ``"ngram-mod,draft-mtp"``, ...; parsed as llama.cpp parses it:
    comma-separated, asked in llama.cpp's order of preference, a name given twice counted once), a list of such values,
    or a short spelling of :data:`MODE_ALIASES` (``mtp``, ``ngram``, ``chain``; the first two also within a chain),
    which comes back under its ``--spec-type`` name. ``policy`` (a chain policy) replaces the choice's own
    (``first`` for ``--spec-type`` chains, as llama.cpp; ``best`` for the ``chain`` alias)."""
    if isinstance(name, DrafterMode):
        found = name
    elif isinstance(name, str) and name in MODES:
        found = MODES[name]
    elif isinstance(name, str) and name in MODE_ALIASES:
        value, own = MODE_ALIASES[name]
        return mode(value, own if policy is None else policy)
    else:
        found = _from_spec_types(name)
    if policy is None or policy == found.policy:
        return found
    if policy not in CHAIN_POLICIES:
        raise ParameterError(f"chain_policy must be one of {CHAIN_POLICIES}, got {policy!r}")
    return _with_policy(found, policy)


def _with_policy(found: DrafterMode, policy: str) -> DrafterMode:
    """``found`` verified under ``policy``, labelled as such (a registry choice's label names its own policy)."""
    if not found.is_chain:
        return dataclasses.replace(found, policy=policy)
    names = [d.label for d in found.drafters]
    if policy == "best":
        label = f"{' or '.join(names)}, best"
        description = (
            f"llama.cpp's --spec-type {found.spec_types} with chain_policy='best': every drafter asked at "
            "every step, the draft with the highest expected accepted length verified"
        )
    else:
        label = ", then ".join(names)
        description = f"llama.cpp's --spec-type {found.spec_types}: the first drafter with a draft"
    return dataclasses.replace(found, policy=policy, label=label, description=description)


def _spec_type_names(value: str | Sequence[str]) -> list[str]:
    """The ``--spec-type`` names of ``value``: a string split at commas (as llama.cpp's string_split), or a list
    of such strings (as ``--spec-type`` given several times)."""
    if isinstance(value, str):
        return value.split(",")
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, str) for v in value):
        return [n for v in value for n in v.split(",")]
    raise ParameterError(
        f"drafter must be one of {DRAFTER_MODES} or llama.cpp --spec-type names "
        f"({', '.join(SPEC_TYPE_ORDER)}; comma-separated or a list for a chain), got {value!r}"
    )


def _from_spec_types(value: str | Sequence[str]) -> DrafterMode:
    """The mode of a ``--spec-type`` value (see :func:`mode`)."""
    names = [_unalias(n) for n in _spec_type_names(value)]
    by_type = {s.name: s for s in DRAFTER_SPECS.values()}
    for n in names:
        if n == _SPEC_TYPE_NONE:
            raise ParameterError("--spec-type none drafts nothing: use n_max=0 with any drafter")
        if n not in SPEC_TYPE_ORDER:
            raise ParameterError(
                f"drafter must be one of {DRAFTER_MODES} or llama.cpp --spec-type names "
                f"({', '.join(SPEC_TYPE_ORDER)}): unknown speculative type {n!r} in {value!r}"
            )
    chain = tuple(by_type[t] for t in SPEC_TYPE_ORDER if t in names)
    listed = next((m for m in MODES.values() if m.drafters == chain and m.policy == CHAIN_POLICIES[0]), None)
    if listed is not None:
        return listed
    return DrafterMode(
        ",".join(s.name for s in chain),
        chain,
        policy=CHAIN_POLICIES[0],
        label=", then ".join(s.label for s in chain),
        description=f"llama.cpp's --spec-type {','.join(s.name for s in chain)}",
    )


def spec_type_choices() -> tuple[str, ...]:
    """Every listed choice as llama.cpp's ``--spec-type`` value, once each, in the registry's order: what a
    drafter control offers (a chain policy besides)."""
    return tuple(dict.fromkeys(m.spec_types for m in MODES.values()))


def mode_name(name: str | Sequence[str] | DrafterMode) -> str:
    """The ``--spec-type`` name of a ``drafter=`` value (a short spelling's, a list's): the name settings, traces
    and messages use."""
    return mode(name).name


def default_mode(has_mtp: bool) -> str:
    """The mode a model starts with: MTP where it has the head, else the first look-up."""
    return DEFAULT_MODE if has_mtp else next(m.name for m in MODES.values() if m.runs_with(False))


def available_modes(has_mtp: bool, has_draft_model: bool | str = False) -> tuple[str, ...]:
    """The listed modes that can draft in a session with (or without) an MTP head and a draft model."""
    return tuple(m.name for m in MODES.values() if m.runs_with(has_mtp, has_draft_model))


def recording_mode(has_mtp: bool, has_draft_model: bool | str = False) -> DrafterMode:
    """The mode an oracle recording runs: every drafter the session can use (in the engine's order), asked at
    every position."""
    specs = tuple(s for s in DRAFTER_SPECS.values() if s.runs_with(has_mtp, has_draft_model))
    return DrafterMode(
        "+".join(s.name for s in specs),
        specs,
        policy="best",
        label="every drafter",
        description="the oracle: every drafter asked at every position",
    )


def all_options() -> tuple[DrafterOption, ...]:
    """Every drafter option, once each."""
    seen: dict[str, DrafterOption] = {}
    for spec in DRAFTER_SPECS.values():
        for o in spec.options:
            seen.setdefault(o.name, o)
    return tuple(seen.values())


def option_values(given: Mapping[str, Any] | None = None) -> dict[str, int | str]:
    """Every option's value: ``given`` where named (checked; an alias counts as its option's name), llama.cpp's
    default elsewhere. Unknown names, and an option given under two names, are a :class:`ParameterError`."""
    given = dict(given or {})
    canonical = {a: o.name for o in all_options() for a in o.aliases}
    for alias, name in canonical.items():
        if alias in given:
            if name in given:
                raise ParameterError(f"{alias} is another name of {name}: give one of them")
            given[name] = given.pop(alias)
    known = {o.name: o for o in all_options()}
    unknown = sorted(set(given) - set(known))
    if unknown:
        raise ParameterError(f"unknown drafter option(s) {unknown}; known: {sorted(known)}")
    return {name: o.check(given.get(name, o.default)) for name, o in known.items()}


def recorded_options(settings: Mapping[str, Any], options: Sequence[DrafterOption] | None = None) -> dict[str, Any]:
    """The drafters' option values a trace's or an oracle's ``settings`` recorded (of ``options``; default: every
    drafter's), by keyword."""
    return {o.name: settings[o.name] for o in (all_options() if options is None else options) if o.name in settings}


def engine_options(values: Mapping[str, int | str]) -> dict[str, int | str]:
    """The drafters' options as the engine takes them (``GenerationConfig.options``, ``record_oracle``): every
    option's value by its keyword (``values``: from :func:`option_values`), an integer or a file name."""
    return {o.name: str(values[o.name]) if o.is_path else int(values[o.name]) for o in all_options()}


def configure(config: Any, values: Mapping[str, int | str]) -> Any:
    """Set the drafters' options on the engine's ``config`` (a GenerationConfig) from option values; returns
    ``config``."""
    config.options = engine_options(values)
    return config
