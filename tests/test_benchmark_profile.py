"""benchmarks/perf_profile.py reads perf's report into samples per library and symbol."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from perf_profile import parse_report, spec_settings, summarise  # noqa: E402

REPORT = """\
# Samples: 41K of event 'cycles:P'
#
# Overhead       Samples  Shared Object                          Symbol
# ........  ............  .....................................  ..........................
#
    12.78%          5334  libggml-cpu.so.0                       [.] 0x0000000000106205
    10.73%          4479  libggml-cpu.so.0                       [.] 0x00000000001062ae
     9.15%          3818  libc.so.6                              [.] __memmove_avx512_unaligned_erms
     6.04%          2521  libggml-cpu.so.0                       [.] ggml_vec_dot_q8_0_q8_0
     0.05%            21  _native.cpython-311-x86_64-linux-gnu.so  [.] CandidateRanking::rank(float const*, int)
     0.01%             4  [kernel.kallsyms]                      [k] native_write_msr
"""


def test_the_report_is_read_per_library_and_symbol_with_addresses_pooled():
    counts = parse_report(REPORT)
    assert counts == {
        ("libggml-cpu.so.0", "(no symbol)"): 5334 + 4479,
        ("libc.so.6", "__memmove_avx512_unaligned_erms"): 3818,
        ("libggml-cpu.so.0", "ggml_vec_dot_q8_0_q8_0"): 2521,
        ("_native.cpython-311-x86_64-linux-gnu.so", "CandidateRanking::rank(float const*, int)"): 21,
        ("[kernel.kallsyms]", "native_write_msr"): 4,
    }


def test_the_summary_gives_shares_per_token_and_the_symbols_above_the_threshold():
    counts = parse_report(REPORT)
    got = summarise(counts, tokens=100, min_share=0.1)
    total = 5334 + 4479 + 3818 + 2521 + 21 + 4
    assert got["samples"] == total and got["samples_per_token"] == pytest.approx(total / 100)
    assert list(got["libraries"])[0] == "libggml-cpu.so.0"
    assert got["libraries"]["libc.so.6"] == {"share": pytest.approx(3818 / total), "samples_per_token": 38.18}
    assert [(s["library"], s["symbol"]) for s in got["symbols"]] == [
        ("libggml-cpu.so.0", "(no symbol)"),
        ("libc.so.6", "__memmove_avx512_unaligned_erms"),
        ("libggml-cpu.so.0", "ggml_vec_dot_q8_0_q8_0"),
    ]


def test_a_spec_type_runs_with_the_drafters_sections_options_and_slots():
    assert spec_settings(None, 3) == {"drafter": {}, "options": {}, "open": {}}
    chain = spec_settings("ngram-mod,draft-mtp", 3)
    assert chain["drafter"] == {"drafter": "ngram-mod,draft-mtp"}
    assert chain["options"] == {"ngram_mod_n_max": 3, "ngram_mod_n_min": 3}
    assert chain["open"] == {"n_rs_seq": 3, "capacity": 3}  # draft-mtp's snapshot slots, as the reference's
    assert spec_settings("ngram-simple", 4)["open"] == {"n_rs_seq": 0, "capacity": 4}  # checkpoints
