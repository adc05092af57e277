"""The shape of the code: one schema and one drafter registry shared by the native engine and Python,
drafter names spelled only in the registry, small classes and functions, engine errors typed."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import io
import math
import re
import tokenize
from pathlib import Path

import numpy as np
import pytest

import mtp_explorer as mx
from mtp_explorer import _native
from mtp_explorer.analysis import ngram_cache
from mtp_explorer.core import drafters, schema
from mtp_explorer.core.errors import ENGINE_ERROR_KINDS
from mtp_explorer.core.options import SessionOptions

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "mtp_explorer"
NATIVE = ROOT / "native_ext"
#: The only Python files allowed to spell a drafter's name.
REGISTRY = {PACKAGE / "core" / "drafters.py"}
#: A backstop to the cohesion rule (test_no_class_reads_private_state_it_does_not_own); packed: a statement spread
#: over lines counts as its text in LINE_WIDTH columns.
MAX_CLASS_LINES = 250
LINE_WIDTH = 120
MAX_CPP_FUNCTION_LINES = 80


# -- one schema ------------------------------------------------------------------------------------
def test_native_columns_match_the_python_schema(session_mixed):
    """A generation's native columns are exactly the schema's, with its dtypes and widths."""
    trace = session_mixed.generate("def fib(n):", max_tokens=24, n_max=3)
    schema.check_columns(trace.columns, dims=schema.Dims(depth=session_mixed.capacity, topk=5))
    assert list(trace.columns) == list(schema.TRACE_COLUMN_NAMES)  # the engine's order
    step_fields = [f.name for f in dataclasses.fields(mx.Step)]
    assert step_fields == list(schema.TRACE_COLUMN_NAMES)


def test_native_oracle_columns_match_the_schema(session_mixed):
    oracle = session_mixed.record_oracle("def fib(n):", max_tokens=12, depth=3)
    native = {c.name for c in schema.ORACLE_COLUMNS}
    assert native <= set(oracle.columns)
    dims = schema.Dims(depth=3, topk=5)
    for c in schema.ORACLE_COLUMNS:
        arr = oracle.columns[c.name]
        assert arr.dtype == c.dtype and arr.shape[1:] == c.inner_shape(dims), c.name


def test_a_column_off_the_schema_is_refused():
    cols = schema.empty_columns(2, schema.Dims(depth=3, topk=2))
    schema.check_columns(cols)
    cols["drafted"] = cols["drafted"].astype(np.int64)
    with pytest.raises(ValueError, match="drafted"):
        schema.check_columns(cols)
    del cols["drafted"]
    with pytest.raises(ValueError, match="missing"):
        schema.check_columns(cols)


@pytest.mark.parametrize("n_max, p_min", [(4, 0.2), (0, 0.0), (3, 0.97)])
def test_step_records_round_trip_through_padded_columns(session_mixed, n_max, p_min):
    """Records (with steps that drafted nothing too) written back into padded columns give the columns."""
    trace = session_mixed.generate("import os\n", max_tokens=20, n_max=n_max, p_min=p_min)
    cols = schema.empty_columns(trace.n_steps, schema.dims_of(trace.columns))
    for i, step in enumerate(trace.steps):
        for c in schema.TRACE_COLUMNS:
            schema.set_row(c, cols, i, getattr(step, c.name))
    for name, arr in trace.columns.items():
        np.testing.assert_array_equal(cols[name], arr, err_msg=name)


# -- one registry ----------------------------------------------------------------------------------
def test_registry_names_the_engines_drafters_and_policies():
    assert tuple(drafters.DRAFTER_SPECS) == tuple(_native.DRAFTERS) == mx.DRAFTERS
    for mode in drafters.MODES.values():
        assert mode.policy in _native.CHAIN_POLICIES
        assert all(d.name in _native.DRAFTERS for d in mode.drafters)
    for spec in drafters.DRAFTER_SPECS.values():
        assert spec.name in drafters.SPEC_TYPE_ORDER and spec.label and spec.replay
        spec.load_replay()  # the simulator has a replay for every drafter
        for option in spec.options:
            assert option.flag.startswith("--spec-" if not option.is_path else "--lookup-cache-")
    # the engine takes every option by its keyword
    config = drafters.configure(_native.GenerationConfig(), drafters.option_values())
    assert config.options == {o.name: o.default for o in drafters.all_options()}


def test_each_drafter_is_written_once():
    """A drafter's traits live in the engine's table only (the Python record has no field for them), and the what-if
    replays every look-up whose drafts depend on its state by walking the engine's drafter (LookupReplay): no Python
    copy of a drafter's drafting to keep equal by hand. A new look-up is its C++ class, one table entry, a record
    (label, options, description) naming LookupReplay, and its tests."""
    fields = {f.name for f in dataclasses.fields(drafters.DrafterSpec)}
    assert not fields & {"needs", "has_confidence", "snapshot_slots", "draft_file", "spec_type"}
    assert [t["name"] for t in _native.DRAFTER_TRAITS] == list(drafters.DRAFTER_SPECS)
    for spec in drafters.DRAFTER_SPECS.values():
        traits = drafters.TRAITS[spec.name]
        assert (spec.needs, spec.has_confidence) == (traits["needs"], traits["has_confidence"])
        if spec.is_lookup and spec.name != "ngram-simple":  # ngram-simple has no state: it reads the oracle's drafts
            assert spec.replay == "LookupReplay", spec.name
    replay_source = (PACKAGE / "analysis" / "replay.py").read_text(encoding="utf-8")
    for gone in ("class NgramModTable", "class NgramMapState", "class NgramCacheState", "def lookup("):
        assert gone not in replay_source
    assert not hasattr(ngram_cache, "draft")  # the n-gram cache module writes and reads llama.cpp's files only


def _strings_of(path: Path) -> list[str]:
    """The string literals of a Python or C++ source file, docstrings and comments left out."""
    if path.suffix == ".py":
        return [text for _, text in _code_strings(path)]
    return re.findall(r'"((?:\\.|[^"\\])*)"', re.sub(r"//[^\n]*", "", path.read_text(encoding="utf-8")))


@pytest.mark.parametrize(
    "name, files",
    [
        ("ngram-mod", {"native_ext/ngram_mod_drafter.cpp"}),
        ("ngram-map-k", set()),  # its class (ngram_map_drafter) serves ngram-map-k4v too: the table entry picks it
    ],
)
def test_a_look_up_drafter_is_its_class_its_table_entry_and_its_record(name, files):
    """Where a look-up drafter's name is used (string literals outside comments and docstrings, in the package and
    the engine): its C++ class, the engine's drafter table and the Python record with its options, nowhere else. So
    adding one touches those three places and its tests; the what-if replays it through the engine (LookupReplay)."""
    word = re.compile(rf"(?<![\w-])({re.escape(name)}|{re.escape(name.replace('-', '_'))})(?![\w-])")
    sources = sorted(PACKAGE.rglob("*.py")) + sorted(NATIVE.glob("*.[ch]*"))
    naming = {str(p.relative_to(ROOT)) for p in sources if any(word.search(s) for s in _strings_of(p))}
    assert naming == {"native_ext/drafters.cpp", "mtp_explorer/core/drafters.py"} | files


def test_oracle_records_every_drafter_in_the_per_drafter_columns(model_mixed, model_synthetic_draft):
    """A drafter needs no oracle column of its own: the oracle records one proposal per drafter of the recording
    mode in the per-drafter columns (its slice, by its index), and every replay reads only those."""
    # small look-up sizes, so that every drafter drafts in this short recording
    with mx.Session.open(model_mixed, n_ctx=512, draft_model=model_synthetic_draft) as s:
        oracle = s.record_oracle(
            "x = [1, 2]\nx = [1, 2]\nx = [",
            max_tokens=16,
            depth=3,
            probe=False,
            ngram_simple_size_n=1,
            ngram_simple_size_m=2,
            ngram_mod_n_match=2,
            ngram_mod_n_min=1,
            ngram_map_k_size_n=1,
            ngram_map_k_size_m=2,
            ngram_map_k4v_size_n=1,
            ngram_map_k4v_size_m=2,
        )
    per_source = {c.name for c in schema.ORACLE_COLUMNS if c.per_source}
    assert {"draft", "draft_len", "draft_eos", "draft_prob", "t_draft_ns"} <= per_source
    recorded = oracle.columns["cap"] > 0
    mode = drafters.recording_mode(oracle.has_mtp, oracle.has_draft_model)
    # MTP and a draft model: every drafter but the heads' (a session holds one draft model file; their slices stay
    # empty here and are recorded in tests/test_draft_eagle3.py and tests/test_draft_dflash.py)
    assert oracle.has_draft_model == "draft_model"
    assert mode.drafters == tuple(
        s for s in drafters.DRAFTER_SPECS.values() if s.needs in ("nothing", "mtp", "draft_model")
    )
    for spec in set(drafters.DRAFTER_SPECS.values()) - set(mode.drafters):
        assert not oracle.replay(spec).available and not oracle.columns["draft_len"][:, spec.index].any()
    for spec in mode.drafters:
        replay = oracle.replay(spec)
        assert replay.extra_columns == () and set(replay.columns) <= per_source, spec.name
        lengths = oracle.columns["draft_len"][:, spec.index]
        assert (lengths[recorded] >= 0).all() and (lengths[recorded] <= oracle.columns["cap"][recorded]).all()
        assert np.array_equal(replay.length, lengths) and np.array_equal(
            replay.tokens, oracle.columns["draft"][:, spec.index]
        )
        drafted = np.arange(3)[None, :] < lengths[:, None]
        assert ((replay.tokens >= 0) == drafted).all(), spec.name
        assert (oracle.columns["t_draft_ns"][recorded, spec.index] >= 0).all(), spec.name
        probs = oracle.columns["draft_prob"][:, spec.index][drafted]
        assert drafted.any() and (~np.isnan(probs) if spec.has_confidence else np.isnan(probs)).all(), spec.name


def test_unknown_drafters_and_options_are_parameter_errors(session_mixed):
    with pytest.raises(mx.ParameterError, match="drafter must be one of"):
        session_mixed.generate("x", max_tokens=2, drafter="eagle")
    with pytest.raises(mx.ParameterError, match="unknown drafter option"):
        session_mixed.generate("x", max_tokens=2, drafter="ngram", ngram_q=3)
    with pytest.raises(mx.ParameterError, match="--spec-ngram-simple-size-n"):
        session_mixed.generate("x", max_tokens=2, drafter="ngram", ngram_n=0)


def _code_strings(path: Path) -> list[tuple[int, str]]:
    """String constants of a module that are not docstrings."""
    tree = ast.parse(path.read_text())
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        (n.lineno, n.value)
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docstrings
    ]


def test_no_drafter_name_literals_outside_the_registry():
    names = set(drafters.DRAFTER_MODES) | set(drafters.DRAFTER_SPECS)
    found = [
        f"{path.relative_to(ROOT)}:{line}: {value!r}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if path not in REGISTRY
        for line, value in _code_strings(path)
        if value in names
    ]
    assert not found, "drafter names spelled outside core/drafters.py:\n" + "\n".join(found)


# -- small pieces ----------------------------------------------------------------------------------
def _packed_rows(text: str) -> list[float]:
    """Each line's share of the lines its statement takes packed into 120 columns (1 for a line alone, a docstring's
    or a comment's): a class's size as written, whichever way the formatter spreads a call over lines."""
    lines = text.split("\n")
    weight = [1.0] * (len(lines) + 2)
    start, multiline_string = None, False
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type in (tokenize.NL, tokenize.COMMENT, tokenize.INDENT, tokenize.DEDENT):
            continue
        start = tok.start[0] if start is None else start
        multiline_string |= tok.type == tokenize.STRING and tok.end[0] > tok.start[0]
        if tok.type in (tokenize.NEWLINE, tokenize.ENDMARKER):
            end = tok.start[0]
            if end > start and not multiline_string:
                joined = " ".join(line.strip() for line in lines[start - 1 : end])
                indent = len(lines[start - 1]) - len(lines[start - 1].lstrip())
                packed = math.ceil((indent + len(joined)) / LINE_WIDTH)
                weight[start : end + 1] = [packed / (end - start + 1)] * (end - start + 1)
            start, multiline_string = None, False
    return weight


def test_the_option_defaults_are_the_engines_written_once():
    """The option records read their defaults from the engine's structs (native_ext/engine.h, placement.h, draft.h,
    sequence.h); Session.open spells its keywords' defaults out for its readers: they must be the same."""
    engine, placement = _native.EngineOptions(), _native.Placement()
    params, generation = _native.DraftParams(), _native.GenerationConfig()
    options = SessionOptions()
    assert (options.n_ctx, options.n_rs_seq, options.topk, options.telemetry, options.n_parallel) == (
        engine.n_ctx,
        engine.n_rs_seq,
        engine.topk,
        engine.telemetry,
        engine.n_parallel,
    )
    for name in ("n_gpu_layers", "main_gpu", "flash_attn", "type_k", "type_v", "load_mode", "repack"):
        assert getattr(options, name) == getattr(placement, name), name
    settings = mx.DraftSettings()
    assert (settings.n_max, settings.p_min, settings.n_min) == (params.n_max, params.p_min, params.n_min)
    for name in ("max_tokens", "temperature", "server_slot", "schedule", "window"):
        assert getattr(settings, name) == getattr(generation, name), name
    fields = {f.name: f.default for f in dataclasses.fields(SessionOptions)}
    spelled = inspect.signature(mx.Session.open).parameters
    differ = {n: (p.default, fields[n]) for n, p in spelled.items() if n in fields and p.default != fields[n]}
    assert differ == {"repack": (None, True)}, differ  # open's repack=None: llama.cpp's default unless AMX fails


def test_no_class_is_over_the_size_limit():
    long = []
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text()
        weight = _packed_rows(text)
        for node in ast.walk(ast.parse(text)):
            size = round(sum(weight[node.lineno : node.end_lineno + 1])) if isinstance(node, ast.ClassDef) else 0
            if size > MAX_CLASS_LINES:
                long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({size} lines)")
    assert not long, long


def _foreign_private_reads(text: str) -> dict[str, list[str]]:
    """Per class, the underscore attributes it reads on ``self``/``cls`` that its own body neither defines nor
    assigns: state or helpers it takes from a base or a mixin (dunders aside)."""
    out = {}
    for cls in [n for n in ast.walk(ast.parse(text)) if isinstance(n, ast.ClassDef)]:
        own, reads = set(), set()
        for node in cls.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                own.add(node.name)
            for target in node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]:
                if isinstance(target, ast.Name):
                    own.add(target.id)
        for node in ast.walk(cls):
            on_self = isinstance(node, ast.Attribute) and getattr(node.value, "id", None) in ("self", "cls")
            if on_self and node.attr.startswith("_") and not node.attr.startswith("__"):
                (own if isinstance(node.ctx, ast.Store) else reads).add(node.attr)
            is_setattr = isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "__setattr__"
            if is_setattr and len(node.args) > 1 and isinstance(node.args[1], ast.Constant):
                own.add(node.args[1].value)  # object.__setattr__(self, "_x", ...) in a frozen dataclass
        if reads - own:
            out[cls.name] = sorted(reads - own)
    return out


def test_no_class_reads_private_state_it_does_not_own():
    """Cohesion: a class's private fields and helpers are its own. A class that reads ``self._x`` defined by a base or
    a mixin (as the session's parts once read ``self._engine``, ``self._run``, ... of each other) is split by size, not
    by job: it should hold the other part and use its public methods."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        foreign = _foreign_private_reads(path.read_text())
        if foreign:
            found[str(path.relative_to(ROOT))] = foreign
    assert not found, found


def test_the_cohesion_check_sees_a_mixin():
    mixin = (
        "class Handle:\n    def __init__(self):\n        self._engine = 1\n"
        "class Probes:\n    def probe(self):\n        return self._engine, self._own()\n"
        "    def _own(self):\n        self._cache = 2\n        return self._cache\n"
    )
    assert _foreign_private_reads(mixin) == {"Probes": ["_engine"]}


def test_the_class_size_is_the_packed_size():
    spread = "class A:\n    x = f(\n        1,\n        2,\n    )\n    y = 1\n"
    assert sum(_packed_rows(spread)[1:7]) == 3  # lines 1-6: the class line, the call packed into one, y


def _cpp_functions(text: str):
    """(name, first line, line count) of every brace-delimited function body at namespace or class scope."""
    text = re.sub(r"//[^\n]*", "", text)
    text = re.sub(r'"(?:\\.|[^"\\])*"', '""', text)
    head = re.compile(
        r"([A-Za-z_~][\w:~<>]*)\s*\([^;{}]*\)\s*(?:const\s*)?(?:noexcept\s*)?(?:override\s*)?"
        r"(?::[^;{]*)?\{$"
    )
    out, i, depth_stack = [], 0, []
    for m in re.finditer(r"[{}]", text):
        if m.group() == "{":
            before = text[max(0, m.start() - 400) : m.end()]
            fn = head.search(before.replace("\n", " "))
            depth_stack.append(
                (
                    fn.group(1) if fn and fn.group(1) not in ("if", "for", "while", "switch", "catch") else None,
                    m.start(),
                )
            )
        else:
            name, start = depth_stack.pop()
            if name and not any(n for n, _ in depth_stack):  # outermost function body only
                first = text.count("\n", 0, start) + 1
                out.append((name, first, text.count("\n", start, m.start()) + 1))
        i += 1
    return out


def test_no_cpp_function_is_over_80_lines():
    long = [
        f"{path.name}:{line} {name} ({n} lines)"
        for path in sorted(NATIVE.glob("*.[ch]*"))
        for name, line, n in _cpp_functions(path.read_text())
        if n > MAX_CPP_FUNCTION_LINES
    ]
    assert not long, long


def test_the_function_length_check_sees_functions():
    text = "int f(int a) {\n" + "  a++;\n" * 90 + "}\nstruct S { void g() const {\n  return;\n } };\n"
    found = {name: n for name, _, n in _cpp_functions(text)}
    assert found["f"] == 92 and found["g"] == 3


# -- engine errors ---------------------------------------------------------------------------------
def test_every_native_throw_is_a_typed_engine_error():
    kinds = set(_native.ENGINE_ERROR_KINDS)
    assert kinds == set(ENGINE_ERROR_KINDS)
    for path in sorted(NATIVE.glob("*.[ch]*")):
        for line_no, line in enumerate(path.read_text().splitlines(), 1):
            # nb::python_error: a Python exception re-raised as it is (a signal handler's, bindings.cpp SignalChecks)
            if (
                re.search(r"\bthrow\b", line)
                and "EngineError" not in line
                and "throw nb::python_error();" not in line
                and not line.strip().startswith("//")
            ):
                pytest.fail(f"{path.name}:{line_no} throws something other than EngineError: {line.strip()}")


@pytest.mark.parametrize("kind", sorted(ENGINE_ERROR_KINDS))
def test_engine_error_kinds_map_to_package_exceptions(kind):
    """The native module's exception translator raises the package's exception for every kind, as thrown."""
    with pytest.raises(ENGINE_ERROR_KINDS[kind]) as info:
        _native.raise_engine_error(kind, f"{kind} failed (llama_process returned -3)")
    assert (
        isinstance(info.value, mx.MtpExplorerError) and str(info.value) == f"{kind} failed (llama_process returned -3)"
    )


def test_a_decode_failure_is_a_decode_error():
    with pytest.raises(mx.DecodeError) as info:
        _native.raise_engine_error("decode", "target decode failed (llama_process returned 1)")
    assert isinstance(info.value, mx.EngineError) and isinstance(info.value, RuntimeError)
    assert "target decode failed" in str(info.value)
    with pytest.raises(mx.ParameterError, match='no engine error kind "nonsense"'):
        _native.raise_engine_error("nonsense", "x")


def test_engine_errors_are_translated_once_natively():
    """No Python module wraps native calls to translate their errors: the translator in bindings.cpp does it."""
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text()
        assert "engine_errors" not in text and "_native.EngineError" not in text, path


# -- one place for the drafting settings' rules ----------------------------------------------------------
SETTINGS_MODULE = PACKAGE / "core" / "settings.py"
#: Messages about the *shape* of a grid argument (a sequence of numbers), not about a setting's range.
_GRID_PARSING = ("must be sequences of numbers", "one per setting")
_RANGE_RULE = re.compile(r"\b(n_max|p_min|n_min)\b[^\n]*\b(must|exceeds|outside|larger than|between|below|above)\b")


def _raised_messages(path: Path) -> list[tuple[int, str]]:
    """The literal text of every message a module raises (f-strings' constant parts joined)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Raise) and node.exc is not None:
            parts = [n.value for n in ast.walk(node.exc) if isinstance(n, ast.Constant) and isinstance(n.value, str)]
            out.append((node.lineno, " … ".join(parts)))
    return out


def test_drafting_settings_are_checked_in_one_place():
    """No module but core/settings.py raises about n_max / p_min / n_min ranges: every caller builds a DraftSettings
    (and checks it against a session's or an oracle's Limits) instead of re-implementing the rules."""
    found = [
        f"{path.relative_to(ROOT)}:{line}: {msg!r}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if path != SETTINGS_MODULE
        for line, msg in _raised_messages(path)
        if _RANGE_RULE.search(msg) and not any(g in msg for g in _GRID_PARSING)
    ]
    assert not found, "drafting-settings rules outside core/settings.py:\n" + "\n".join(found)
    assert any(_RANGE_RULE.search(m) for _, m in _raised_messages(SETTINGS_MODULE))  # the check sees the rules


def test_the_engine_backstops_the_settings_rules(session_mixed):
    """Settings that reach the engine without DraftSettings are refused natively, as a ParameterError."""
    engine = session_mixed.engine
    for params in (
        _native.DraftParams(n_max=session_mixed.capacity + 1, p_min=0.0, n_min=0),
        _native.DraftParams(n_max=2, p_min=1.5, n_min=0),
        _native.DraftParams(n_max=2, p_min=0.0, n_min=3),
    ):
        with pytest.raises(mx.ParameterError):
            engine.set_params(params)
    assert session_mixed.params["n_max"] <= session_mixed.capacity


# -- drafters read the target through declared features ----------------------------------------------------
#: The only native files that may name the MTP drafter's class: its own, and the drafter table.
MTP_FILES = {"mtp_drafter.h", "mtp_drafter.cpp", "drafters.cpp"}


def _cpp_code(path: Path) -> str:
    """A C++ file without its comments."""
    return re.sub(r"//[^\n]*|/\*.*?\*/", "", path.read_text(), flags=re.S)


def test_the_engine_has_no_mtp_special_case():
    """The step, oracle and request code reach the MTP head only through the Drafter interface (its declared
    features, observe_target, keep, the table's batch functions): no `q.mtp`, no MtpDrafter outside its own files
    and the table, and the target's hidden states read in one place, the engine's feature extraction."""
    found = []
    for path in sorted(NATIVE.glob("*.[ch]*")):
        code = _cpp_code(path)
        if re.search(r"(\.|->)mtp\b", code):
            found.append(f"{path.name}: reaches a sequence's MTP drafter directly")
        if path.name not in MTP_FILES and "MtpDrafter" in code:
            found.append(f"{path.name}: names MtpDrafter")
    assert not found, "\n".join(found)
    readers = [p.name for p in sorted(NATIVE.glob("*.cpp")) if "get_embeddings_nextn_ith(ctx_tgt" in _cpp_code(p)]
    assert readers == ["step.cpp"], readers  # Engine::extract_features
    assert "TargetRows Engine::extract_features(" in (NATIVE / "step.cpp").read_text()


# -- imports between layers -------------------------------------------------------------------------------------------
PACKAGE = Path(mx.__file__).resolve().parent
#: The layers from the bottom: a module imports only its own layer and those below (models, analysis and server sit
#: side by side above core). Core imports nothing above it: the work of a session's methods that lives above core
#: (recording an oracle, measuring the batch shift) is handed over through :mod:`mtp_explorer.core.hooks`.
LAYERS = {"core": 0, "models": 1, "analysis": 1, "server": 1, "viz": 2, "ui": 3}
FUNCTION_LEVEL_IMPORTS_MAX = 0  # imports of the package's own modules inside functions; this only goes down


def _package_imports(root: Path = PACKAGE, prefix: str = "mtp_explorer") -> list[tuple[str, str, str]]:
    """(importer, imported, where) for every import of one of the package's modules by another, names relative to
    the package (``root``, imported as ``prefix``); where is "module", "function" or "typing" (under
    ``if TYPE_CHECKING``)."""

    def name_of(path: Path) -> str:
        parts = path.relative_to(root).with_suffix("").parts
        return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)

    modules = {name_of(p): p for p in root.rglob("*.py")}
    known = modules.keys() | {"_native"}  # the extension module: a module without a .py file, importing none of ours
    found = []
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]

        def visit(node: ast.AST, where: str) -> None:
            for child in ast.iter_child_nodes(node):
                inner = where
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    inner = "function"
                elif isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                    inner = "typing" if where == "module" else where
                if isinstance(child, ast.ImportFrom) and child.level:
                    base = package.split(".") if package else []
                    base = base[: len(base) - child.level + 1]
                    target = ".".join([*base, *([child.module] if child.module else [])]).strip(".")
                    hits = {f"{target}.{a.name}".strip(".") for a in child.names} & known
                    for hit in sorted(hits or ({target} & known)):
                        found.append((name, hit, inner))
                elif isinstance(child, (ast.Import, ast.ImportFrom)):
                    absolute = [a.name for a in child.names] if isinstance(child, ast.Import) else [child.module or ""]
                    for a in absolute:
                        if a.startswith(f"{prefix}."):
                            rel = a.removeprefix(f"{prefix}.")
                            if rel in known:
                                found.append((name, rel, inner))
                visit(child, inner)

        visit(tree, "module")
    return found


def _layer(module: str) -> int | None:
    return LAYERS.get(module.split(".")[0])


def test_the_import_walk_sees_every_kind_of_import(tmp_path):
    imports = set(_package_imports())
    assert ("core.trace", "core.metrics", "module") in imports  # from . import metrics
    assert ("analysis.simulate", "core.metrics", "module") in imports  # from ..core import metrics
    assert ("analysis.oracle", "core.session", "typing") in imports
    assert ("core.native", "_native", "module") in imports  # the extension: a module without a .py file
    (tmp_path / "core").mkdir()
    (tmp_path / "__init__.py").write_text("")
    (tmp_path / "core" / "__init__.py").write_text("")
    (tmp_path / "core" / "a.py").write_text("def f():\n    from . import b\n    import pkg.core.c\n")
    (tmp_path / "core" / "b.py").write_text("")
    (tmp_path / "core" / "c.py").write_text("")
    found = set(_package_imports(tmp_path, "pkg"))
    assert found == {("core.a", "core.b", "function"), ("core.a", "core.c", "function")}


def test_one_module_imports_the_extension():
    """core/native.py is the extension's one door: every other module takes its names from there."""
    assert {a for a, b, _ in _package_imports() if b == "_native"} == {"core.native"}


def test_no_module_imports_a_layer_above_its_own():
    upward = {
        (a, b)
        for a, b, _ in _package_imports()
        if _layer(a) is not None and _layer(b) is not None and _layer(b) > _layer(a)  # type: ignore[operator]
    }
    assert not upward, f"upward imports: {sorted(upward)}"
    assert not {(a, b) for a, b, _ in _package_imports() if a.startswith("core.") and _layer(b) != 0 and b != "_native"}


def _circles(edges: set[tuple[str, str]]) -> list[list[str]]:
    """The import circles of ``edges`` (strongly connected groups of two modules or more; Tarjan's walk)."""
    graph: dict[str, set[str]] = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)
        graph.setdefault(b, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_circles():
    """No group of the package's modules imports itself round (imports for the type checker aside)."""
    edges = {(a, b) for a, b, where in _package_imports() if where != "typing" and a != b}
    assert not _circles(edges), _circles(edges)
    assert _circles({("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")}) == [["a", "b", "c"]]  # the walk sees one


def test_core_hands_its_upper_work_to_registered_providers(session_mixed):
    """Every piece of work core hands over is provided once the package is imported, by the module that says so; the
    session's method runs it."""
    import importlib

    from mtp_explorer.analysis import batch_shift, oracle
    from mtp_explorer.core import hooks

    assert hooks.provided() == set(hooks.PROVIDERS)
    for name, module in hooks.PROVIDERS.items():
        assert hasattr(importlib.import_module(module), "hooks"), (name, module)
    o = session_mixed.record_oracle("def fib(n):", max_tokens=8, depth=2, probe=False, batch_shift=False)
    assert isinstance(o, oracle.OracleTrace) and len(o.tokens) == 8
    assert isinstance(session_mixed.batch_shift([2]), batch_shift.BatchShift)
    with pytest.raises(ValueError, match="no work called"):
        hooks.provide("unknown", print)


def test_the_drafter_registry_knows_the_replays_without_importing_them():
    source = (PACKAGE / "core" / "drafters.py").read_text(encoding="utf-8")
    assert "importlib" not in source and "analysis" not in re.sub(r'""".*?"""|#.*', "", source, flags=re.S)
    for spec in drafters.DRAFTER_SPECS.values():
        assert spec.load_replay().__name__ == spec.replay


def test_function_level_imports_do_not_grow():
    inside = [(a, b) for a, b, where in _package_imports() if where == "function"]
    assert len(inside) <= FUNCTION_LEVEL_IMPORTS_MAX, sorted(inside)


#: Reads of another object's private attributes (``x._name``, x not ``self``/``cls``) left in the package, by file:
#: plotly's FigureWidget takes its config only through its private ``_config``. This only shrinks.
PRIVATE_READS_ALLOWED = {
    "mtp_explorer/ui/figure_sync.py": {"widget._config"},
}


def _private_reads(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            if not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                out.add(f"{ast.unparse(node.value)}.{node.attr}")
    return out


def test_no_object_reads_another_objects_private_fields():
    """Objects talk through public names: no ``other._field`` outside the listed leftovers (which must still exist,
    so the list shrinks as they go)."""
    found = {}
    for path in sorted((ROOT / "mtp_explorer").rglob("*.py")):
        reads = _private_reads(path)
        if reads:
            found[str(path.relative_to(ROOT))] = reads
    assert found == PRIVATE_READS_ALLOWED


def test_the_private_read_check_sees_reads(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("def f(s, o):\n    s._x = 1\n    return self._ok, o._y.z, o.__len__, o.pub\n")
    assert _private_reads(probe) == {"s._x", "o._y"}
