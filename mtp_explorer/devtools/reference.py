"""llama.cpp's own MTP driver, ``llama-speculative-simple --spec-type draft-mtp``, run beside ours.

Used to check parity: for greedy decoding the generated tokens and the totals of drafted and
accepted tokens must match. llama-speculative-simple has its own budget rule, replayed here with
:func:`replay_reference_budget`: it drafts at most ``n - n_predict - 1`` tokens but truncates only
when that number is positive (a draft at the very end is verified whole), and it stops once
*more* than ``n`` tokens were produced. Our engine never exceeds ``max_tokens``, so the replay drives
it step by step through :meth:`Session.set_params` with that rule.
"""

from __future__ import annotations

import dataclasses
import re
import subprocess
import tempfile
from pathlib import Path

from ..core import drafters
from ..core.session import Session
from ..core.trace import Trace


@dataclasses.dataclass(frozen=True)
class ReferenceRun:
    """What llama-speculative-simple printed."""

    text: str
    """The generated pieces as printed (token_to_piece, no detokenizer clean-up)."""
    n_predict: int
    n_drafted: int
    n_accept: int
    decode_seconds: float
    tokens_per_second: float


_STAT = {
    "n_predict": re.compile(r"n_predict\s*=\s*(\d+)"),
    "n_drafted": re.compile(r"n_drafted\s*=\s*(\d+)"),
    "n_accept": re.compile(r"n_accept\s*=\s*(\d+)"),
    "decoded": re.compile(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds, speed:\s+([\d.]+) t/s"),
}


def parse_reference_output(stdout: str, stderr: str, prompt_text: str) -> ReferenceRun:
    """Read the generated text and the totals from llama-speculative-simple's output."""
    log = stdout + "\n" + stderr
    found = {k: rx.search(log) for k, rx in _STAT.items()}
    missing = [k for k, m in found.items() if m is None]
    if missing:
        raise ValueError(f"llama-speculative-simple output lacks {missing}:\n{log[-2000:]}")
    start = stdout.find(prompt_text)
    if start < 0:
        raise ValueError("the prompt was not echoed in llama-speculative-simple's output")
    body = stdout[start + len(prompt_text):]
    tail = "\n\n\n\n"  # the example prints "\n\n" after the loop and again before it exits
    if not body.endswith(tail):
        raise ValueError("unexpected end of llama-speculative-simple's output")
    text = body[: -len(tail)]
    return ReferenceRun(
        text=text,
        n_predict=int(found["n_predict"].group(1)),
        n_drafted=int(found["n_drafted"].group(1)),
        n_accept=int(found["n_accept"].group(1)),
        decode_seconds=float(found["decoded"].group(2)),
        tokens_per_second=float(found["decoded"].group(3)),
    )


def run_reference(binary: str | Path, model: str | Path, prompt: str, *, max_tokens: int, n_max: int,
                  p_min: float = 0.0, n_min: int = 0, n_ctx: int = 4096, threads: int = 2,
                  timeout: float = 300, attempts: int = 8) -> ReferenceRun:
    """Run llama-speculative-simple greedily with MTP drafting and parse what it printed."""
    spec = ["--spec-type", "draft-mtp", "--spec-draft-n-max", str(n_max), "--spec-draft-n-min", str(n_min),
            "--spec-draft-p-min", str(p_min)]
    return run_reference_spec(binary, model, prompt, spec, max_tokens=max_tokens, n_ctx=n_ctx, threads=threads,
                              timeout=timeout, attempts=attempts)


def spec_type_args(spec: str, n_max: int, options: dict[str, int | str]) -> list[str]:
    """llama-speculative-simple's arguments for ``--spec-type spec`` with our drafter ``options`` (each under its
    llama.cpp flag from the registry; a file option naming no file is left out) and ``n_max`` as the draft models'
    ``--spec-draft-n-max``."""
    flags = {o.name: o.flag for o in drafters.all_options()}
    args = ["--spec-type", spec, "--spec-draft-n-max", str(n_max)]
    for name, value in options.items():
        if value != "":
            args += [flags[name], str(value)]
    return args


def reference_n_max(spec: str, n_max: int) -> int:
    """The n_max our engine runs ``--spec-type spec`` at so as to verify the drafts llama-speculative-simple verifies:
    it verifies a look-up's whole draft (``--spec-draft-n-max`` limits the draft models only), so where a drafter's
    length is fixed in llama.cpp (:attr:`DrafterSpec.fixed_draft_len`, ngram-cache's 8) that length, for every drafter
    of the chain (the reference's --spec-draft-n-max too); else ``n_max`` (a look-up's own length option is then set
    to it)."""
    return max((d.fixed_draft_len for d in drafters.mode(spec).drafters), default=0) or n_max


def run_reference_spec(binary: str | Path, model: str | Path, prompt: str, spec_args: list[str], *,
                       max_tokens: int, n_ctx: int = 4096, threads: int = 2, timeout: float = 300,
                       attempts: int = 8) -> ReferenceRun:
    """Run llama-speculative-simple greedily with the drafting options ``spec_args`` (``--spec-type ...``)
    and parse what it printed."""
    cmd = [
        str(binary), "-m", str(model), "-p", prompt, "-n", str(max_tokens), "-c", str(n_ctx), "-t", str(threads),
        "--temp", "0", "--seed", "0", *spec_args,
    ]
    # llama.cpp's log is written by a worker thread that sometimes loses its tail when the program
    # exits; the run is deterministic, so it is repeated until the output is complete.
    error: Exception | None = None
    for _ in range(attempts):
        with tempfile.TemporaryDirectory() as tmp:
            out, err = Path(tmp, "stdout"), Path(tmp, "stderr")
            with out.open("w") as fo, err.open("w") as fe:
                proc = subprocess.run(cmd, stdout=fo, stderr=fe, timeout=timeout)
            stdout, stderr = out.read_text(errors="replace"), err.read_text(errors="replace")
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{stderr[-3000:]}")
        try:
            return parse_reference_output(stdout, stderr, prompt)
        except ValueError as exc:
            error = exc
    raise RuntimeError(f"llama-speculative-simple printed incomplete output {attempts} times") from error


def draft_cap_rule(session: Session, prompt: str, max_tokens: int, limit: int):
    """llama-speculative-simple's draft cap after ``n_predict`` generated tokens, as a function of
    ``n_predict``: ``limit`` cut to the budget left (``max_tokens - n_predict - 1``) and the context,
    but only when that is positive (otherwise ``limit`` as is)."""
    n_prompt = len(session.tokenize(prompt))

    def n_max_for(n_predict: int) -> int:
        n_past = n_prompt - 1 + n_predict
        cap = min(session.n_ctx - n_past - 2, max_tokens - n_predict - 1)
        return min(limit, cap) if cap > 0 else limit

    return n_max_for


def replay_reference_budget(session: Session, prompt: str, *, max_tokens: int, n_max: int, p_min: float = 0.0,
                            n_min: int = 0, drafter: str | None = None, **options: int | str) -> Trace:
    """Greedy generation with our engine under llama-speculative-simple's budget rule (see module doc).

    ``drafter`` (default: the MTP head) and ``options`` as :meth:`Session.generate` takes them (a ``--spec-type``
    chain runs under llama.cpp's ``first`` policy). Exact for ``n_min == 0``; with ``n_min > 0`` the reference
    applies n_min before its budget truncation, which a shorter n_max cannot reproduce at the very last steps.
    """

    n_max_for = draft_cap_rule(session, prompt, max_tokens, n_max)
    n_predict = 0
    chosen = {} if drafter is None else {"drafter": drafter}
    stream = session.stream(prompt, max_tokens=max_tokens + n_max + 1, n_max=n_max_for(0), p_min=p_min,
                            n_min=min(n_min, n_max_for(0)), **chosen, **options)
    for step in stream:
        n_predict += step.n_accepted + 1
        if n_predict > max_tokens or session.is_eog(step.correction):
            session.cancel()
            continue
        nxt = n_max_for(n_predict)
        session.set_params(n_max=nxt, p_min=p_min, n_min=min(n_min, nxt))
    return session.last_trace


def compare_with_reference(ref: ReferenceRun, ours: Trace, p_min: float) -> dict:
    """Parity of one run: text and drafted/accepted totals, with our end-of-generation rule accounted for.

    We stop drafting at an end-of-generation token; the reference drafts on past it. With
    ``p_min == 0`` it always drafts to its cap, so its drafted total is still known exactly; with
    ``p_min > 0`` such runs compare text and accepted totals only (``unverifiable_drafted_total``).
    """
    totals = {"n_predict": len(ours.tokens), "n_drafted": int(ours.n_drafted.sum()), "n_accept": int(ours.n_accepted.sum())}
    reference = {"n_predict": ref.n_predict, "n_drafted": ref.n_drafted, "n_accept": ref.n_accept}
    eos_steps = [st for st in ours.steps if st.stop_reason == "eos"]
    expected = dict(totals)
    unverifiable = bool(eos_steps) and p_min > 0
    if eos_steps and not unverifiable:
        expected["n_drafted"] += sum(st.n_max - st.n_drafted for st in eos_steps)
    text_equal = "".join(ours.pieces) == ref.text
    if unverifiable:
        match = text_equal and reference["n_predict"] == totals["n_predict"] and reference["n_accept"] == totals["n_accept"]
    else:
        match = text_equal and reference == expected
    return {"reference": reference, "ours": totals, "text_equal": text_equal, "eos_stopped_steps": len(eos_steps),
            "explained_by_eos_rule": bool(eos_steps) and match and not unverifiable,
            "unverifiable_drafted_total": unverifiable, "match": match}
