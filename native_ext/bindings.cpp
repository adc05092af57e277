// Python bindings: the Engine, its telemetry as numpy columns, and llama.cpp log capture.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdio>
#include <cstdlib>
#include <deque>
#include <mutex>

#include "engine.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace {

// llama.cpp log lines: kept (the last 200) for error messages, printed only with MTP_EXPLORER_VERBOSE=1
std::mutex log_mutex;
std::deque<std::string> log_lines;
std::string log_partial;

void log_callback(ggml_log_level level, const char * text, void *) {
    static const bool verbose = std::getenv("MTP_EXPLORER_VERBOSE") != nullptr;
    if (verbose) {
        std::fputs(text, stderr);
    }
    if (level == GGML_LOG_LEVEL_DEBUG) {
        return;
    }
    std::lock_guard<std::mutex> lk(log_mutex);
    log_partial += text;
    size_t nl;
    while ((nl = log_partial.find('\n')) != std::string::npos) {
        log_lines.push_back(log_partial.substr(0, nl));
        log_partial.erase(0, nl + 1);
        if (log_lines.size() > 200) {
            log_lines.pop_front();
        }
    }
}

std::vector<std::string> take_log() {
    std::lock_guard<std::mutex> lk(log_mutex);
    std::vector<std::string> out(log_lines.begin(), log_lines.end());
    log_lines.clear();
    return out;
}

// rows [row0, n_rows) of a column with `inner` values per row, copied into a numpy array
template <typename T>
nb::object column(const std::vector<T> & v, size_t row0, size_t n_rows, std::initializer_list<size_t> inner) {
    size_t per_row = 1;
    for (size_t d : inner) {
        per_row *= d;
    }
    auto * data = new std::vector<T>(v.begin() + row0 * per_row, v.begin() + (row0 + n_rows) * per_row);
    nb::capsule owner(data, [](void * p) noexcept { delete static_cast<std::vector<T> *>(p); });
    std::vector<size_t> shape{n_rows};
    shape.insert(shape.end(), inner.begin(), inner.end());
    return nb::cast(nb::ndarray<nb::numpy, T>(data->data(), shape.size(), shape.data(), owner));
}

nb::dict columns(const Engine & e, size_t row0) {
    const Telemetry & t = e.tel;
    const size_t n = t.rows() > row0 ? t.rows() - row0 : 0;
    const size_t D = (size_t) t.depth, K = (size_t) t.topk;
    nb::dict d;
    d["step"] = column(t.step, row0, n, {});
    d["pos"] = column(t.pos, row0, n, {});
    d["n_max"] = column(t.n_max, row0, n, {});
    d["p_min"] = column(t.p_min, row0, n, {});
    d["n_min"] = column(t.n_min, row0, n, {});
    d["drafted"] = column(t.drafted, row0, n, {D});
    d["n_drafted"] = column(t.n_drafted, row0, n, {});
    d["n_accepted"] = column(t.n_accepted, row0, n, {});
    d["draft_prob"] = column(t.draft_prob, row0, n, {D});
    d["topk_ids"] = column(t.topk_ids, row0, n, {D, K});
    d["topk_probs"] = column(t.topk_probs, row0, n, {D, K});
    d["target_tokens"] = column(t.target_tokens, row0, n, {D + 1});
    d["stop_reason"] = column(t.stop_reason, row0, n, {});
    d["correction"] = column(t.correction, row0, n, {});
    d["rollback"] = column(t.rollback, row0, n, {});
    d["rs_slot"] = column(t.rs_slot, row0, n, {});
    d["h_norm_target"] = column(t.h_norm_target, row0, n, {D + 1});
    d["h_norm_draft"] = column(t.h_norm_draft, row0, n, {D});
    d["draft_target_cos"] = column(t.draft_target_cos, row0, n, {D});
    d["t_catchup_ns"] = column(t.t_catchup_ns, row0, n, {});
    d["t_draft_ns"] = column(t.t_draft_ns, row0, n, {});
    d["t_verify_ns"] = column(t.t_verify_ns, row0, n, {});
    d["t_sample_ns"] = column(t.t_sample_ns, row0, n, {});
    const size_t S = (size_t) Telemetry::n_sources;
    d["drafter"] = column(t.drafter, row0, n, {});
    d["expected_accepted"] = column(t.expected_accepted, row0, n, {});
    d["candidate_len"] = column(t.candidate_len, row0, n, {S});
    d["candidate_expected"] = column(t.candidate_expected, row0, n, {S});
    return d;
}

nb::dict oracle_columns(const OracleRecord & o) {
    const size_t n = o.rows(), N = (size_t) o.depth, K = (size_t) o.topk;
    nb::dict d;
    d["pos"] = column(o.pos, 0, n, {});
    d["token"] = column(o.token, 0, n, {});
    d["target_margin"] = column(o.target_margin, 0, n, {});
    d["cap"] = column(o.cap, 0, n, {});
    d["chain_len"] = column(o.chain_len, 0, n, {});
    d["chain_eos"] = column(o.chain_eos, 0, n, {});
    d["ngram_len"] = column(o.ngram_len, 0, n, {});
    d["ngram_eos"] = column(o.ngram_eos, 0, n, {});
    d["chain"] = column(o.chain, 0, n, {N});
    d["chain_prob"] = column(o.chain_prob, 0, n, {N});
    d["chain_margin"] = column(o.chain_margin, 0, n, {N});
    d["ngram"] = column(o.ngram, 0, n, {N});
    d["topk_ids"] = column(o.topk_ids, 0, n, {N, K});
    d["topk_probs"] = column(o.topk_probs, 0, n, {N, K});
    d["t_verify_ns"] = column(o.t_verify_ns, 0, n, {});
    d["t_catchup_ns"] = column(o.t_catchup_ns, 0, n, {});
    d["t_sample_ns"] = column(o.t_sample_ns, 0, n, {});
    d["t_argmax_ns"] = column(o.t_argmax_ns, 0, n, {});
    d["t_draft_ns"] = column(o.t_draft_ns, 0, n, {});
    d["t_draft_cum_ns"] = column(o.t_draft_cum_ns, 0, n, {N});
    d["t_ngram_ns"] = column(o.t_ngram_ns, 0, n, {});
    d["probe_k"] = column(o.probe_k, 0, n, {});
    d["verify_after"] = column(o.verify_after, 0, n, {});
    d["probe_verify_ns"] = column(o.probe_verify_ns, 0, n, {});
    d["probe_verify_reuse_ns"] = column(o.probe_verify_reuse_ns, 0, n, {});
    d["probe_catchup_ns"] = column(o.probe_catchup_ns, 0, n, {});
    d["probe_argmax_ns"] = column(o.probe_argmax_ns, 0, n, {});
    d["probe_rollback_ns"] = column(o.probe_rollback_ns, 0, n, {});
    d["tail_pos"] = column(o.tail_pos, 0, o.tail_pos.size(), {});
    d["tail_verify_ns"] = column(o.tail_verify_ns, 0, o.tail_verify_ns.size(), {});
    return d;
}

}  // namespace

NB_MODULE(_native, m) {
    m.doc() = "mtp-explorer native engine: llama.cpp MTP speculative decoding with per-step telemetry";
    llama_log_set(log_callback, nullptr);
    llama_backend_init();

    m.def("take_log", &take_log, "llama.cpp log lines (info and above) since the last call.");
    m.def("missing_nextn_symbols", [](const std::string & path) { return NextnApi{}.load(path); }, "path"_a = "",
          "Names of the nextn API functions that the libllama at `path` (default: the linked one) lacks.");
    m.def("libllama_path", &linked_libllama_path, "Path of the libllama this module is linked against.");
    m.attr("STOP_REASONS") = nb::make_tuple("n_max", "p_min", "eos", "budget", "context", "exhausted");
    m.attr("DRAFTERS") = nb::make_tuple("mtp", "ngram");
    m.attr("DRAFTER_MODES") = nb::make_tuple("mtp", "ngram", "chain");
    m.attr("FINISH_REASONS") = nb::make_tuple("budget", "eos", "context", "cancelled");
    m.attr("DRAFT_N_CANDIDATES") = DRAFT_N_CANDIDATES;

    nb::class_<Engine>(m, "Engine")
        .def("__init__",
             [](Engine * self, const std::string & path, int32_t n_ctx, int32_t n_threads, int32_t n_rs_seq,
                int32_t topk, bool telemetry, bool cpu_clock) {
                 EngineOptions o;
                 o.cpu_clock = cpu_clock;
                 o.path = path;
                 o.n_ctx = n_ctx;
                 o.n_threads = n_threads;
                 o.n_rs_seq = n_rs_seq;
                 o.topk = topk;
                 o.telemetry = telemetry;
                 nb::gil_scoped_release release;
                 new (self) Engine(o);
             },
             "path"_a, "n_ctx"_a, "n_threads"_a, "n_rs_seq"_a, "topk"_a, "telemetry"_a, "cpu_clock"_a = false)
        .def("close", [](Engine & e) { nb::gil_scoped_release r; e.close(); })
        .def_prop_ro("closed", &Engine::closed)
        .def_prop_ro("n_vocab", &Engine::n_vocab)
        .def_prop_ro("n_embd", &Engine::n_embd)
        .def_prop_ro("n_ctx", &Engine::n_ctx)
        .def_prop_ro("n_layer_nextn", &Engine::n_layer_nextn)
        .def_prop_ro("has_mtp", &Engine::has_mtp)
        .def_prop_ro("is_recurrent", &Engine::is_recurrent)
        .def_prop_ro("capacity", &Engine::capacity)
        .def_prop_ro("rs_slots", &Engine::rs_slots)
        .def_prop_ro("eos", &Engine::eos)
        .def_prop_ro("n_threads", [](const Engine & e) { return e.options().n_threads; })
        .def_prop_ro("topk", [](const Engine & e) { return e.options().topk; })
        .def_prop_ro("cpu_clock", [](const Engine & e) { return e.options().cpu_clock; })
        .def_prop_rw("telemetry", &Engine::telemetry, &Engine::set_telemetry)
        .def("is_eog", &Engine::is_eog)
        .def("tokenize", &Engine::tokenize, "text"_a, "add_special"_a = false)
        .def("detokenize", &Engine::detokenize)
        .def("piece", &Engine::piece)
        .def("begin",
             [](Engine & e, const std::vector<llama_token> & prompt, int32_t max_tokens, float temperature,
                uint32_t seed, int32_t n_max, float p_min, int32_t n_min, int32_t mode, int32_t ngram_n,
                int32_t ngram_m) {
                 if (mode < MODE_MTP || mode > MODE_CHAIN) {
                     throw std::invalid_argument("unknown drafter mode " + std::to_string(mode));
                 }
                 GenerationConfig c{max_tokens, temperature, seed, (DrafterMode) mode, NgramConfig{ngram_n, ngram_m}};
                 nb::gil_scoped_release r;
                 e.begin(prompt, c, DraftParams{n_max, p_min, n_min});
             },
             "prompt"_a, "max_tokens"_a, "temperature"_a, "seed"_a, "n_max"_a, "p_min"_a, "n_min"_a,
             "mode"_a = 0, "ngram_n"_a = 3, "ngram_m"_a = 8)
        .def("record_oracle",
             [](Engine & e, const std::vector<llama_token> & prompt, int32_t max_tokens, int32_t depth, int32_t ngram_n,
                int32_t ngram_m, bool probe) {
                 OracleRecord rec;
                 bool done;
                 {
                     nb::gil_scoped_release r;
                     done = e.record_oracle(prompt, max_tokens, depth, NgramConfig{ngram_n, ngram_m}, probe, rec);
                 }
                 return nb::make_tuple(done, oracle_columns(rec));
             },
             "prompt"_a, "max_tokens"_a, "depth"_a, "ngram_n"_a, "ngram_m"_a, "probe"_a = true)
        .def("step", [](Engine & e) { nb::gil_scoped_release r; return e.step(); })
        .def("run", [](Engine & e) { nb::gil_scoped_release r; e.run(); })
        .def("set_params",
             [](Engine & e, int32_t n_max, float p_min, int32_t n_min) { e.set_params(DraftParams{n_max, p_min, n_min}); },
             "n_max"_a, "p_min"_a, "n_min"_a)
        .def("params", [](const Engine & e) { const auto p = e.params(); return nb::make_tuple(p.n_max, p.p_min, p.n_min); })
        .def("cancel", &Engine::cancel)
        .def("columns", [](const Engine & e, size_t row0) {
                 std::lock_guard<std::mutex> lk(e.run_mutex);
                 return columns(e, row0);
             }, "row0"_a = 0)
        .def_prop_ro("n_rows", [](const Engine & e) { return e.tel.rows(); })
        .def("generated", [](const Engine & e, size_t from) {
                 std::lock_guard<std::mutex> lk(e.run_mutex);
                 return std::vector<llama_token>(e.generated.begin() + std::min(from, e.generated.size()), e.generated.end());
             }, "from"_a = 0)
        .def_prop_ro("n_generated", [](const Engine & e) { return e.generated.size(); })
        .def_prop_ro("finish", [](const Engine & e) { return (int) e.finish; })
        .def_prop_ro("t_prefill_ns", [](const Engine & e) { return e.t_prefill_ns; })
        .def_prop_ro("n_prompt", [](const Engine & e) { return e.n_prompt; });
}
