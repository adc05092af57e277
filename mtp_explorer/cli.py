"""The ``mtp-explorer`` command: ``run`` streams a generation, ``info`` describes a model file, ``synth`` writes a
SYNTHETIC model of an architecture, ``profile`` measures this machine's cost profile (``costs=`` of simulate and
sweep)."""

from __future__ import annotations

import argparse
import json
import sys

from rich.console import Console, Group
from rich.live import Live
from rich.panel import Panel
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from .analysis.profile import profile_costs
from .core import drafters
from .core.drafters import DrafterOption
from .core.errors import MtpExplorerError, ParameterError
from .core.info import model_info
from .core.options import FLASH_ATTN_VALUES, KV_CACHE_TYPES, LOAD_MODES
from .core.session import Session
from .core.settings import DraftSettings
from .models import default_model_path, demo_prompt_within, demo_prompts
from .models.synth import SYNTH_ARCHS, write_synth

STYLE = {"accepted": "bold cyan", "correction": "yellow", "plain": ""}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mtp-explorer", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="stream a generation with speculative drafting, accepted drafts coloured")
    run.add_argument(
        "prompt",
        nargs="*",
        default=[],
        help="prompt text (default: the bundled model's first demo prompt, a held-out snippet of real "
        "code); with -np N, up to N prompts (the demo prompts fill the rest)",
    )
    run.add_argument("--model", "-m", default=None, help="GGUF model (default: the bundled demo model)")
    run.add_argument("--max-tokens", "-n", type=int, default=128)
    run.add_argument(
        "--spec-draft-n-max",
        "--n-max",
        dest="n_max",
        type=int,
        default=3,
        metavar="N",
        help="largest draft (llama.cpp's default: 3; 0: plain decoding)",
    )
    run.add_argument(
        "--drafter",
        "--spec-type",
        type=_drafter_choice,
        default=drafters.DEFAULT_MODE,
        help=_escape(
            "llama.cpp's --spec-type value (comma-separated for a chain: "
            + ", ".join(drafters.SPEC_TYPE_ORDER)
            + ", as far as the explorer has them) or "
            + "; ".join(f"{m.name}: {m.description}" for m in drafters.MODES.values())
        )
        + f" (default: {drafters.DEFAULT_MODE}; the short spellings "
        + ", ".join(drafters.MODE_ALIASES)
        + " are taken for the values they stand for)",
    )
    run.add_argument(
        "--chain-policy",
        choices=drafters.CHAIN_POLICIES,
        default=None,
        help="the draft a chain verifies: first (llama.cpp's, the default for --spec-type chains: the "
        "first drafter with a draft) or best (the highest expected accepted length)",
    )
    for option in drafters.all_options():
        _add_option(run, option)
    confident = ", ".join(s.label for s in drafters.DRAFTER_SPECS.values() if s.has_confidence)
    run.add_argument(
        "--spec-draft-p-min",
        "--draft-p-min",
        "--p-min",
        dest="p_min",
        type=float,
        default=0.0,
        metavar="P",
        help=f"draft confidence floor ({confident} drafts; default: 0.0)",
    )
    run.add_argument(
        "--spec-draft-n-min",
        "--n-min",
        dest="n_min",
        type=int,
        default=0,
        metavar="N",
        help="drafts shorter than this are dropped (default: 0)",
    )
    run.add_argument(
        "--parallel",
        "-np",
        dest="n_parallel",
        type=int,
        default=1,
        metavar="N",
        help="sequences decoded together (llama.cpp's -np): N requests at once, with per-request and "
        "aggregate tables (default: 1)",
    )
    run.add_argument("--temperature", type=float, default=0.0)
    run.add_argument("--seed", type=int, default=0)
    add_session_args(run)
    run.add_argument("--json", metavar="FILE", help="also write the trace as JSON")

    info = sub.add_parser("info", help="what a model file holds")
    info.add_argument("model", nargs="?", default=None, help="GGUF model (default: the bundled demo model)")
    info.add_argument("--json", action="store_true", help="print JSON")
    info.add_argument(
        "--head",
        default=None,
        metavar="FNAME",
        help="a separate MTP head file (llama.cpp's -md): report the model paired with it",
    )

    synth = sub.add_parser(
        "synth",
        help="write a SYNTHETIC (random-weight) model of an architecture, with its head "
        "file where its MTP mode needs one; prints each path, the target first",
    )
    synth.add_argument(
        "--arch",
        required=True,
        metavar="ARCH",
        help="the architecture: " + ", ".join(f"{a} ({mode} MTP)" for a, (mode, _) in _synth_archs()),
    )
    synth.add_argument("--out", required=True, metavar="DIR", help="the folder to write into (created if missing)")
    synth.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    synth.add_argument(
        "--context-mix",
        type=float,
        default=0.0,
        help="how much context the trunk mixes in (0: every draft accepted; default: 0)",
    )
    synth.add_argument(
        "--mtp-fidelity",
        type=float,
        default=1.0,
        help="how faithfully the MTP head copies the trunk, in [0, 1] (default: 1)",
    )

    prof = sub.add_parser("profile", help="measure this machine's cost profile for a model and save it (costs=)")
    prof.add_argument("model", nargs="?", default=None, help="GGUF model (default: the bundled demo model)")
    prof.add_argument("--output", "-o", required=True, metavar="FILE", help="where to write the profile (JSON)")
    prof.add_argument("--max-tokens", "-n", type=int, default=128, help="tokens generated per built-in prompt")
    prof.add_argument(
        "--depth", type=int, default=None, help="deepest oracle the profile can price (default: --n-rs-seq)"
    )
    add_session_args(prof)
    return p


def _synth_archs():
    return SYNTH_ARCHS.items()


def add_session_args(parser: argparse.ArgumentParser) -> None:
    """The options of ``Session.open`` as flags, with llama.cpp's short names and defaults."""
    parser.add_argument("--n-ctx", "-c", "--ctx-size", dest="n_ctx", type=int, default=4096, help="context size")
    parser.add_argument("--threads", "-t", type=int, default=None, help="generation threads (default: all cores)")
    parser.add_argument(
        "--threads-batch",
        "-tb",
        dest="threads_batch",
        type=int,
        default=None,
        help="threads for prompt batches (default: --threads)",
    )
    parser.add_argument(
        "--n-rs-seq",
        type=int,
        default=8,
        help="recurrent snapshot slots (largest n_max; 0: checkpoints, the look-ups and draft-simple only)",
    )
    parser.add_argument(
        "--capacity", type=int, default=None, help="largest n_max (default: --n-rs-seq; 8 with --n-rs-seq 0)"
    )
    parser.add_argument(
        "--n-gpu-layers",
        "-ngl",
        "--gpu-layers",
        dest="n_gpu_layers",
        default="auto",
        metavar="N",
        type=_gpu_layers,
        help="layers offloaded to the GPU: a number, 'auto' or 'all' (default: auto)",
    )
    parser.add_argument("--main-gpu", "-mg", dest="main_gpu", type=int, default=0, help="GPU index (default: 0)")
    parser.add_argument(
        "--flash-attn",
        "-fa",
        dest="flash_attn",
        choices=FLASH_ATTN_VALUES,
        default="auto",
        help="flash attention (default: auto)",
    )
    parser.add_argument(
        "--cache-type-k",
        "-ctk",
        dest="type_k",
        choices=KV_CACHE_TYPES,
        default="f16",
        metavar="TYPE",
        help=f"K cache type: {', '.join(KV_CACHE_TYPES)} (default: f16)",
    )
    parser.add_argument(
        "--cache-type-v",
        "-ctv",
        dest="type_v",
        choices=KV_CACHE_TYPES,
        default="f16",
        metavar="TYPE",
        help="V cache type, as -ctk (default: f16)",
    )
    parser.add_argument(
        "--load-mode",
        "-lm",
        dest="load_mode",
        choices=LOAD_MODES,
        default="auto",
        help="how the model is loaded (default: auto, i.e. mmap)",
    )
    parser.add_argument(
        "--repack",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="repack weights for the CPU's GEMM kernels (default: llama.cpp's --repack, except where "
        "its AMX kernels stop the process: mtp_explorer.check_extra_buffers; --no-repack is -nr)",
    )
    parser.add_argument("-nr", dest="repack", action="store_false", help="--no-repack")
    parser.add_argument(
        "--model-draft",
        "-md",
        dest="draft_model",
        default=None,
        metavar="FNAME",
        help="draft model for --spec-type draft-simple (same vocabulary; default: none)",
    )


SESSION_ARGS = (
    "n_ctx",
    "threads",
    "threads_batch",
    "n_rs_seq",
    "capacity",
    "n_gpu_layers",
    "main_gpu",
    "flash_attn",
    "type_k",
    "type_v",
    "load_mode",
    "repack",
    "draft_model",
)


def session_kwargs(args: argparse.Namespace) -> dict:
    """``Session.open``'s keyword arguments from the flags :func:`add_session_args` added."""
    return {name: getattr(args, name) for name in SESSION_ARGS}


def _gpu_layers(text: str) -> int | str:
    if text in ("auto", "all"):
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of layers, 'auto' or 'all', got {text!r}") from None


def _escape(text: str) -> str:
    """Registry text as an argparse help string (which %-formats it)."""
    return text.replace("%", "%%")


def _drafter_choice(text: str) -> str:
    """An argparse type: a ``drafter=`` choice (a listed mode or llama.cpp's --spec-type value), as given."""
    try:
        drafters.mode(text)
    except ParameterError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _option_owner(option: DrafterOption) -> str:
    return next(s.label for s in drafters.DRAFTER_SPECS.values() if option in s.options)


def _add_option(parser: argparse.ArgumentParser, option: DrafterOption) -> None:
    """A drafter option as a flag: ``--<name>`` (``_`` as ``-``) and llama.cpp's own flag (a file option takes a
    file name, FNAME, as llama.cpp's)."""
    aliases = [f"--{a.replace('_', '-')}" for a in option.aliases]
    flags = dict.fromkeys([f"--{option.name.replace('_', '-')}", option.flag, *aliases])  # (a file option's are one)
    parser.add_argument(
        *flags,
        dest=option.name,
        type=str if option.is_path else _int_in(option),
        default=option.default,
        metavar="FNAME" if option.is_path else "N",
        help=_escape(
            f"{_option_owner(option)} drafter: {option.help} (llama.cpp {option.flag}; default: {option.default!r})"
        ),
    )


def _int_in(option: DrafterOption):
    """An argparse type: an integer in the option's range."""

    def parse(text: str) -> int:
        what = (
            f"a positive integer (at most {option.hi})"
            if option.lo == 1
            else f"an integer in [{option.lo}, {option.hi}]"
        )
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if not option.lo <= value <= option.hi:
            raise argparse.ArgumentTypeError(f"expected {what}, got {value}")
        return value

    parse.__name__ = option.name
    return parse


def _summary_table(summary: dict, drafter: str = drafters.DEFAULT_MODE) -> Table:
    mode = drafters.mode(drafter)
    table = Table(title="summary", show_header=False)
    table.add_column("key", style="bold")
    table.add_column("value", justify="right")
    table.add_row("tokens", str(summary["n_tokens"]))
    table.add_row("steps", str(summary["n_steps"]))
    if mode.name != drafters.DEFAULT_MODE:
        table.add_row("drafter", mode.name)
    table.add_row("drafted / accepted", f"{summary['n_drafted']} / {summary['n_accepted']}")
    if mode.is_chain:
        won = summary.get("steps_by_drafter") or {}
        table.add_row(
            "steps won by drafter",
            "  ".join(f"{spec.name} {won.get(spec.name, 0)}" for spec in mode.drafters)
            + f"  (no draft {won.get('none', 0)})",
        )
    rate = summary["acceptance_rate"]
    table.add_row("acceptance rate", "n/a" if rate != rate else f"{rate:.1%}")
    table.add_row("mean accepted length", f"{summary['mean_accepted_length']:.2f}")
    depth = ", ".join("-" if v != v else f"{v:.0%}" for v in summary["acceptance_by_depth"] if v == v)
    table.add_row("acceptance by depth", depth or "-")
    table.add_row("tokens/s", f"{summary['tokens_per_second']:.1f}")
    phases = summary["phase_seconds"]
    total = sum(phases.values()) or 1.0
    table.add_row("time split", "  ".join(f"{k} {v / total:.0%}" for k, v in phases.items()))
    table.add_row("snapshot slot", f"{summary['rs_slot_bytes']:,} B")
    table.add_row("finished by", summary["finish_reason"])
    return table


def _run(args, console: Console) -> int:
    if args.n_parallel != 1:
        return _run_parallel(args, console)
    if len(args.prompt) > 1:
        raise ParameterError(f"{len(args.prompt)} prompts given: one, or up to N with -np N")
    settings = draft_settings(args)
    with Session.open(args.model, seed=args.seed, **session_kwargs(args)) as s:
        prompt = args.prompt[0] if args.prompt else None
        if prompt is None:  # the bundled model's demo prompt, or the longest part of it that fits this session
            prompt = demo_prompt_within(lambda t: len(s.tokenize(t)), s.n_ctx_seq - args.max_tokens)
        text = Text()
        progress = Progress(
            TextColumn("generating"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.fields[rate]}"),
            console=console,
        )
        task = progress.add_task("gen", total=args.max_tokens, rate="")
        text.append(s.detokenize(s.tokenize(prompt)), style="dim")
        n_done = 0
        with Live(
            Group(Panel(text, title="accepted drafts in cyan, corrections in yellow"), progress),
            console=console,
            refresh_per_second=10,
            transient=not console.is_terminal,
        ):
            for step in s.stream(prompt, settings):
                for tok in step.drafted[: step.n_accepted]:
                    text.append(s.piece(tok), style=STYLE["accepted"])
                text.append(s.piece(step.correction), style=STYLE["correction" if step.drafted else "plain"])
                n_done += step.n_accepted + 1
                progress.update(task, completed=n_done, rate=f"{step.n_accepted}/{step.n_drafted} accepted")
        trace = s.last_trace
        if not console.is_terminal:
            console.print(Panel(text))
        console.print(_summary_table(trace.summary(), settings.mode))
        if args.json:
            with open(args.json, "w") as f:
                f.write(trace.to_json())
            console.print(f"trace written to {args.json}")
    return 0


def draft_settings(args: argparse.Namespace) -> DraftSettings:
    """The drafting settings the ``run`` flags give (checked before any model loads)."""
    return DraftSettings(
        n_max=args.n_max,
        p_min=args.p_min,
        n_min=args.n_min,
        drafter=args.drafter,
        chain_policy=args.chain_policy,
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        options={o.name: getattr(args, o.name) for o in drafters.all_options()},
    )


def _run_parallel(args, console: Console) -> int:
    """``run -np N``: N requests on N sequences at once, then a table per request and the aggregate."""
    n = args.n_parallel
    if n < 1:
        raise ParameterError(f"-np must be >= 1, got {n}")
    if len(args.prompt) > n:
        raise ParameterError(f"{len(args.prompt)} prompts for -np {n}: give at most {n}")
    settings = draft_settings(args)
    with Session.open(args.model, seed=args.seed, n_parallel=n, **session_kwargs(args)) as s:
        budget = s.n_ctx_seq - args.max_tokens
        fill = [p.text for p in demo_prompts() if len(s.tokenize(p.text)) <= budget]
        prompts = (
            list(args.prompt) + [fill[i % len(fill)] for i in range(n - len(args.prompt))]
            if fill
            else list(args.prompt)
        )
        if len(prompts) < n:
            raise ParameterError(f"-np {n} needs {n} prompts: no demo prompt fits n_ctx / -np minus --max-tokens")
        progress = Progress(
            TextColumn(f"generating {n} requests"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
            transient=True,
        )
        with progress:
            task = progress.add_task("gen", total=n * args.max_tokens)
            for steps in s.stream_parallel(prompts, settings):
                progress.advance(task, sum(ps.step.n_accepted + 1 for ps in steps))
        result = s.last_parallel_trace
    summary = result.summary()
    console.print(_requests_table(summary, prompts))
    console.print(_aggregate_table(summary))
    if args.json:
        with open(args.json, "w") as f:
            f.write("[" + ",\n".join(t.to_json() for t in result.traces) + "]\n")
        console.print(f"the requests' traces written to {args.json} (a JSON list: mx.Trace.from_json reads each)")
    return 0


def _requests_table(summary: dict, prompts: list[str]) -> Table:
    table = Table(title="per request")
    for col in (
        "seq",
        "slot",
        "prompt",
        "tokens",
        "acceptance",
        "accepted/step",
        "latency s",
        "tokens/s",
        "finished by",
    ):
        table.add_column(col, justify="left" if col in ("prompt", "finished by") else "right")
    for r, prompt in zip(summary["requests"], prompts):
        rate = r["acceptance_rate"]
        table.add_row(
            str(r["seq"]),
            str(r["slot"]),
            prompt.strip().splitlines()[0][:24],
            str(r["n_tokens"]),
            "n/a" if rate != rate else f"{rate:.1%}",
            f"{r['mean_accepted_length']:.2f}",
            f"{r['latency_seconds']:.2f}",
            f"{r['tokens_per_second']:.1f}",
            r["finish_reason"],
        )
    return table


def _aggregate_table(summary: dict) -> Table:
    table = Table(title=f"aggregate (-np {summary['n_parallel']})", show_header=False)
    table.add_column("key", style="bold")
    table.add_column("value", justify="right")
    rate = summary["acceptance_rate"]
    table.add_row(
        "requests / tokens / steps", f"{summary['n_requests']} / {summary['n_tokens']} / {summary['n_steps']}"
    )
    table.add_row("acceptance rate", "n/a" if rate != rate else f"{rate:.1%}")
    table.add_row("tokens/s (prefill included)", f"{summary['tokens_per_second']:.1f}")
    table.add_row("decode tokens/s", f"{summary['decode_tokens_per_second']:.1f}")
    table.add_row("mean active sequences", f"{summary['mean_active']:.2f}")
    table.add_row("mean verify rows", f"{summary['mean_verify_rows']:.2f}")
    table.add_row("snapshot memory", f"{summary['rs_memory_bytes']:,} B")
    return table


def _info(args, console: Console) -> int:
    info = model_info(args.model or default_model_path(), head=args.head)
    if args.json:
        print(json.dumps(info.to_dict(), indent=2))
        return 0
    table = Table(title=info.path, show_header=False)
    table.add_column("key", style="bold")
    table.add_column("value")
    for key, value in info.to_dict().items():
        if key != "path":
            table.add_row(key, f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else str(value))
    table.add_row("experts", info.experts_label())
    console.print(table)
    return 0


def _synth(args, console: Console) -> int:
    """Write a SYNTHETIC model (:func:`mtp_explorer.models.synth.write_synth`) and print its paths, the target
    first, one a line."""
    for path in write_synth(
        args.arch, args.out, seed=args.seed, context_mix=args.context_mix, mtp_fidelity=args.mtp_fidelity
    ):
        print(path)
    return 0


def _profile(args, console: Console) -> int:
    """Measure a cost profile (:func:`mtp_explorer.profile_costs`), save it, print its headline numbers."""
    progress = Progress(
        TextColumn("measuring the cost profile"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    )
    with progress:
        task = progress.add_task("profile", total=None)
        profile = profile_costs(
            args.model or default_model_path(),
            max_tokens=args.max_tokens,
            depth=args.depth,
            progress=lambda done, total: progress.update(task, completed=done, total=total),
            **session_kwargs(args),
        )
    profile.save(args.output)
    s = profile.summary()
    table = Table(title=f"cost profile of {s['file']}", show_header=False)
    table.add_column("key", style="bold")
    table.add_column("value", justify="right")
    table.add_row("machine", f"{s['hostname']} ({profile.machine['cpu_count']} cpus)")
    table.add_row("threads", str(s["threads"]))
    if s["devices"]:
        table.add_row("devices", f"{', '.join(map(str, s['devices']))} (n_gpu_layers {s['n_gpu_layers']})")
    table.add_row("depth", str(s["depth"]))
    table.add_row("positions measured", f"{s['positions']} (mean n_past {s['mean_pos']:.0f})")
    table.add_row("plain tokens/s", f"{s['plain_tokens_per_second']:.1f}")
    if s["ceiling_tokens_per_second"]:
        table.add_row(
            "every draft accepted, tokens/s",
            "  ".join(f"n_max {n}: {v:.1f}" for n, v in s["ceiling_tokens_per_second"].items()),
        )
    table.add_row("verify of k tokens, ms", "  ".join(f"{k}: {v:.2f}" for k, v in s["verify_ms"].items()))
    table.add_row("measured in", f"{s['seconds']:.1f} s")
    console.print(table)
    console.print(f"cost profile written to {args.output} (use it as costs= in simulate, simulate_grid, sweep)")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    console = Console()
    try:
        return {"run": _run, "info": _info, "synth": _synth, "profile": _profile}[args.command](args, console)
    except (MtpExplorerError, FileNotFoundError) as exc:
        console.print(f"[bold red]error:[/] {exc}", soft_wrap=True)  # one line, however long
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
