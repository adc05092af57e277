"""The ``mtp-explorer`` command: ``run`` streams a generation, ``info`` describes a model file."""

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

from .errors import MtpExplorerError
from .session import DEFAULT_NGRAM_M, DEFAULT_NGRAM_N  # (``import mtp_explorer`` loads session anyway)
from .trace import DRAFTER_MODES

STYLE = {"accepted": "bold cyan", "correction": "yellow", "plain": ""}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mtp-explorer", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="stream a generation with speculative drafting, accepted drafts coloured")
    run.add_argument("prompt", nargs="?", default="def fibonacci(n):", help="prompt text")
    run.add_argument("--model", "-m", default=None, help="GGUF model (default: the bundled demo model)")
    run.add_argument("--max-tokens", "-n", type=int, default=128)
    run.add_argument("--n-max", type=int, default=3, help="draft length (0: plain decoding)")
    run.add_argument("--drafter", choices=DRAFTER_MODES, default="mtp",
                     help="mtp: the model's MTP head; ngram: prompt look-up (needs no MTP head); "
                          "chain: both each step, the more promising draft verified (default: mtp)")
    run.add_argument("--ngram-n", type=_positive_int, default=DEFAULT_NGRAM_N,
                     help=f"n-gram drafter: length of the n-gram looked up (default: {DEFAULT_NGRAM_N})")
    run.add_argument("--ngram-m", type=_positive_int, default=DEFAULT_NGRAM_M,
                     help=f"n-gram drafter: continuation length proposed, cut to --n-max (default: {DEFAULT_NGRAM_M})")
    run.add_argument("--p-min", type=float, default=0.0, help="draft confidence floor (MTP drafts)")
    run.add_argument("--n-min", type=int, default=0, help="drafts shorter than this are dropped")
    run.add_argument("--temperature", type=float, default=0.0)
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--n-ctx", type=int, default=4096)
    run.add_argument("--threads", type=int, default=None)
    run.add_argument("--n-rs-seq", type=int, default=8, help="recurrent snapshot slots (largest n_max)")
    run.add_argument("--json", metavar="FILE", help="also write the trace as JSON")

    info = sub.add_parser("info", help="what a model file holds")
    info.add_argument("model", nargs="?", default=None, help="GGUF model (default: the bundled demo model)")
    info.add_argument("--json", action="store_true", help="print JSON")
    return p


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def _summary_table(summary: dict, drafter: str = "mtp") -> Table:
    table = Table(title="summary", show_header=False)
    table.add_column("key", style="bold")
    table.add_column("value", justify="right")
    table.add_row("tokens", str(summary["n_tokens"]))
    table.add_row("steps", str(summary["n_steps"]))
    if drafter != "mtp":
        table.add_row("drafter", drafter)
    table.add_row("drafted / accepted", f"{summary['n_drafted']} / {summary['n_accepted']}")
    if drafter == "chain":
        won = summary.get("steps_by_drafter") or {}
        table.add_row("steps won by drafter",
                      "  ".join(f"{name} {n}" for name, n in won.items() if name != "none")
                      + f"  (no draft {won.get('none', 0)})")
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
    from .session import Session

    with Session.open(args.model, n_ctx=args.n_ctx, threads=args.threads, seed=args.seed, n_rs_seq=args.n_rs_seq) as s:
        text = Text()
        progress = Progress(TextColumn("generating"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                            TextColumn("{task.fields[rate]}"), console=console)
        task = progress.add_task("gen", total=args.max_tokens, rate="")
        text.append(s.detokenize(s.tokenize(args.prompt)), style="dim")
        n_done = 0
        with Live(Group(Panel(text, title="accepted drafts in cyan, corrections in yellow"), progress),
                  console=console, refresh_per_second=10, transient=not console.is_terminal):
            for step in s.stream(args.prompt, max_tokens=args.max_tokens, n_max=args.n_max, p_min=args.p_min,
                                 n_min=args.n_min, temperature=args.temperature, drafter=args.drafter,
                                 ngram_n=args.ngram_n, ngram_m=args.ngram_m):
                for tok in step.drafted[: step.n_accepted]:
                    text.append(s.piece(tok), style=STYLE["accepted"])
                text.append(s.piece(step.correction), style=STYLE["correction" if step.drafted else "plain"])
                n_done += step.n_accepted + 1
                progress.update(task, completed=n_done, rate=f"{step.n_accepted}/{step.n_drafted} accepted")
        trace = s.last_trace
        if not console.is_terminal:
            console.print(Panel(text))
        console.print(_summary_table(trace.summary(), args.drafter))
        if args.json:
            with open(args.json, "w") as f:
                f.write(trace.to_json())
            console.print(f"trace written to {args.json}")
    return 0


def _info(args, console: Console) -> int:
    from .info import model_info
    from .models import default_model_path

    info = model_info(args.model or default_model_path())
    if args.json:
        print(json.dumps(info.to_dict(), indent=2))
        return 0
    table = Table(title=info.path, show_header=False)
    table.add_column("key", style="bold")
    table.add_column("value")
    for key, value in info.to_dict().items():
        if key != "path":
            table.add_row(key, f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else str(value))
    console.print(table)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    console = Console()
    try:
        return {"run": _run, "info": _info}[args.command](args, console)
    except (MtpExplorerError, FileNotFoundError) as exc:
        console.print(f"[bold red]error:[/] {exc}")
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
