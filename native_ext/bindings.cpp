// Python bindings: the config structs, the Engine, its telemetry as numpy columns (generated from
// the schemas in telemetry.h and oracle.h), the name tables, and llama.cpp log capture.
//
// Errors: every EngineError (errors.h) becomes the package's exception for its kind
// (mtp_explorer.core.errors.ENGINE_ERROR_KINDS, e.g. "decode" -> DecodeError) in one exception translator.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/variant.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <exception>
#include <mutex>

#include "engine.h"
#include "layer_inputs.h"
#include "lookup_walk.h"
#include "ngram_drafter.h"
#include "errors.h"
#include "names.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace {

// ---- llama.cpp log lines: kept (the last 200) for error messages, printed only with MTP_EXPLORER_VERBOSE=1

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

// ---- tables and columns -------------------------------------------------------------------------

template <size_t N>
nb::tuple names_tuple(const char * const (&table)[N]) {
    nb::list out;
    for (const char * name : table) {
        out.append(nb::str(name));
    }
    return nb::tuple(out);
}

// the drafter table's names, in DrafterId order
// a telemetry level by its name (TELEMETRY_LEVEL_NAMES); a parameter error for another name
TelemetryLevel telemetry_level(const std::string & name) {
    for (size_t i = 0; i < count_of(TELEMETRY_LEVEL_NAMES); ++i) {
        if (name == TELEMETRY_LEVEL_NAMES[i]) {
            return (TelemetryLevel) i;
        }
    }
    fail(ErrorKind::PARAMETER, "telemetry must be \"off\", \"steps\" or \"full\", got \"" + name + "\"");
}

const char * telemetry_name(TelemetryLevel level) { return TELEMETRY_LEVEL_NAMES[(int32_t) level]; }

nb::tuple drafters_tuple() {
    nb::list out;
    for (int32_t i = 0; i < N_DRAFTERS; ++i) {
        out.append(nb::str(drafter_name(i)));
    }
    return nb::tuple(out);
}

// each drafter's traits, in DrafterId order: its name, what it needs (DRAFTER_NEEDS_NAMES), whether it has a
// confidence, whether llama.cpp gives the target snapshot slots for it and whether it drafts with the draft model file
nb::tuple drafter_traits_tuple() {
    nb::list out;
    for (int32_t i = 0; i < N_DRAFTERS; ++i) {
        const DrafterEntry & e = DRAFTER_TABLE[i];
        nb::dict row;
        row["name"] = e.name;
        row["needs"] = DRAFTER_NEEDS_NAMES[(int) e.needs];
        row["has_confidence"] = e.has_confidence;
        row["snapshot_slots"] = gets_snapshot_slots(e.needs);
        row["draft_file"] = needs_draft_file(e.needs);
        out.append(row);
    }
    return nb::tuple(out);
}

// the kinds of need (DRAFTER_NEEDS_NAMES) that a draft model file serves, in DrafterNeeds order
nb::tuple draft_file_kinds_tuple() {
    nb::list out;
    for (size_t n = 0; n < count_of(DRAFTER_NEEDS_NAMES); ++n) {
        if (needs_draft_file((DrafterNeeds) n)) {
            out.append(nb::str(DRAFTER_NEEDS_NAMES[n]));
        }
    }
    return nb::tuple(out);
}

// ((name, dtype, width kind), ...) of a column schema
template <size_t N>
nb::tuple schema_tuple(const ColumnInfo (&schema)[N]) {
    nb::list out;
    for (const ColumnInfo & c : schema) {
        out.append(nb::make_tuple(c.name, c.dtype, WIDTH_NAMES[(int) c.width]));
    }
    return nb::tuple(out);
}

// rows [row0, row0 + n_rows) of a column with `inner` values per row, copied into a numpy array
template <typename T>
nb::object column(const std::vector<T> & v, size_t row0, size_t n_rows, const std::vector<size_t> & inner) {
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

// {name: array} of a Telemetry or OracleRecord from row0 on, in schema order (tail columns whole)
template <typename Table>
nb::dict columns_dict(const Table & t, size_t row0) {
    const ColumnDims dims = t.dims();
    const size_t n = t.rows() > row0 ? t.rows() - row0 : 0;
    nb::dict d;
    t.for_each_column([&](const char * name, const auto & v, Width w) {
        d[name] = w == Width::TAIL ? column(v, 0, v.size(), {}) : column(v, row0, n, dims.inner(w));
    });
    return d;
}

nb::list drafter_stats(const Sequence & q) {
    nb::list out;
    for (const auto & d : q.drafters) {
        const DrafterStats & s = d->stats;
        nb::dict row;
        row["name"] = d->name();
        row["n_call_begin"] = s.n_call_begin;
        row["n_call_draft"] = s.n_call_draft;
        row["n_call_accept"] = s.n_call_accept;
        row["n_proposals"] = s.n_proposals;
        row["n_gen_drafts"] = s.n_gen_drafts;
        row["n_gen_tokens"] = s.n_gen_tokens;
        row["n_acc_drafts"] = s.n_acc_drafts;
        row["n_acc_tokens"] = s.n_acc_tokens;
        row["acc_by_pos"] = nb::cast(s.acc_by_pos);
        row["n_resets"] = s.n_resets;
        row["t_begin_ns"] = s.t_begin_ns;
        row["t_draft_ns"] = s.t_draft_ns;
        row["t_accept_ns"] = s.t_accept_ns;
        out.append(row);
    }
    return out;
}

// ---- errors -------------------------------------------------------------------------------------

// An EngineError becomes the package's exception for its kind, mtp_explorer.core.errors.ENGINE_ERROR_KINDS[kind]
// (ParameterError, DecodeError, ...), here, once: Python code calls the engine without wrappers.
void translate_engine_error(const std::exception_ptr & p, void *) {
    try {
        std::rethrow_exception(p);
    } catch (const EngineError & e) {
        try {
            nb::object kinds = nb::module_::import_("mtp_explorer.core.errors").attr("ENGINE_ERROR_KINDS");
            PyErr_SetString(kinds[e.kind_name()].ptr(), e.what());
        } catch (const nb::python_error &) {  // the package's errors module missing: still an error, never lost
            PyErr_SetString(PyExc_RuntimeError, (std::string(e.kind_name()) + ": " + e.what()).c_str());
        }
    }
}

void bind_errors(nb::module_ & m) {
    m.attr("ENGINE_ERROR_KINDS") = names_tuple(ERROR_KIND_NAMES);
    m.def("raise_engine_error", [](const std::string & kind, const std::string & message) {
              const int i = name_index(ERROR_KIND_NAMES, kind);
              fail(i < 0 ? ErrorKind::PARAMETER : (ErrorKind) i, i < 0 ? "no engine error kind \"" + kind + "\"" : message);
          }, "kind"_a, "message"_a,
          "Throws the engine's error of `kind` (one of ENGINE_ERROR_KINDS) through the translator, as the engine would.");
    nb::register_exception_translator(translate_engine_error);
}

// ---- module ---------------------------------------------------------------------------------------

void bind_functions(nb::module_ & m) {
    m.def("take_log", &take_log, "llama.cpp log lines (info and above) since the last call.");
    m.def("capture_log", [] { llama_log_set(log_callback, nullptr); },
          "Make the extension's callback llama.cpp's logger again (it is process-wide: llama-cpp-python sets its own).");
    m.def("missing_nextn_symbols", [](const std::string & path) { return NextnApi{}.load(path); }, "path"_a = "",
          "Names of the nextn API functions that the libllama at `path` (default: the linked one) lacks.");
    m.def("libllama_path", &linked_libllama_path, "Path of the libllama this module is linked against.");
    m.def("ngram_simple_draft",
          [](const std::vector<llama_token> & tokens, llama_token sampled, int32_t size_n, int32_t size_m) {
              const NgramConfig cfg = NgramConfig::from({{"ngram_simple_size_n", size_n}, {"ngram_simple_size_m", size_m}});
              return ngram_simple_draft(cfg, tokens.data(), tokens.size(), sampled);
          },
          "tokens"_a, "sampled"_a, "size_n"_a, "size_m"_a,
          "The engine's ngram-simple look-up (llama.cpp's common_ngram_simple_draft) after `tokens` and `sampled`, uncut.");
    using Row = nb::ndarray<const float, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
    m.def("argmax", [](const Row & logits) { return argmax(logits.data(), (int32_t) logits.shape(0)); }, "logits"_a,
          "The engine's greedy token of a row of logits (float32): the first of the largest.");
    m.def("top_logits",
          [](const Row & logits, int32_t k) {
              const int32_t n = (int32_t) logits.shape(0);
              if (k < 1 || k > n) {
                  fail(ErrorKind::PARAMETER, "k must be between 1 and the row's " + std::to_string(n) + " logits");
              }
              std::vector<int32_t> ids((size_t) k);
              std::vector<float> vals((size_t) k);
              top_logits(logits.data(), n, k, ids.data(), vals.data());
              return ids;
          },
          "logits"_a, "k"_a,
          "The ids of the k largest of a row of logits (float32) as the engine's drafters rank them: largest first, "
          "equal ones by increasing id.");
}

void bind_tables(nb::module_ & m) {
    m.attr("STOP_REASONS") = names_tuple(STOP_REASON_NAMES);
    m.attr("BATCH_SHIFT_ROWS_MAX") = BATCH_SHIFT_ROWS_MAX;
    m.attr("LAYER_INPUT_ARCHS") = names_tuple(LAYER_INPUT_ARCHS);
    m.attr("DRAFTERS") = drafters_tuple();
    m.attr("DRAFTER_TRAITS") = drafter_traits_tuple();
    m.attr("DRAFTER_NEEDS_KINDS") = names_tuple(DRAFTER_NEEDS_NAMES);
    m.attr("DRAFT_FILE_KINDS") = draft_file_kinds_tuple();
    m.attr("CHAIN_POLICIES") = names_tuple(CHAIN_POLICY_NAMES);
    m.attr("SCHEDULES") = names_tuple(SCHEDULE_NAMES);
    m.attr("FINISH_REASONS") = names_tuple(FINISH_REASON_NAMES);
    m.attr("WIDTH_KINDS") = names_tuple(WIDTH_NAMES);
    m.attr("TRACE_COLUMNS") = schema_tuple(Telemetry::schema);
    m.attr("ORACLE_COLUMNS") = schema_tuple(OracleRecord::schema);
    m.attr("DRAFT_N_CANDIDATES") = DRAFT_N_CANDIDATES;
}

std::string repr_params(const DraftParams & p) {
    return "DraftParams(n_max=" + std::to_string(p.n_max) + ", p_min=" + std::to_string(p.p_min) +
           ", n_min=" + std::to_string(p.n_min) + ")";
}

void bind_draft_configs(nb::module_ & m) {
    const DraftParams dp;
    nb::class_<DraftParams>(m, "DraftParams", "Live-tunable drafting parameters.")
        .def("__init__", [](DraftParams * self, int32_t n_max, float p_min, int32_t n_min) {
                 new (self) DraftParams{n_max, p_min, n_min};
             }, "n_max"_a = dp.n_max, "p_min"_a = dp.p_min, "n_min"_a = dp.n_min)
        .def_rw("n_max", &DraftParams::n_max)
        .def_rw("p_min", &DraftParams::p_min)
        .def_rw("n_min", &DraftParams::n_min)
        .def("__repr__", &repr_params);
}

void bind_generation_config(nb::module_ & m) {
    const GenerationConfig gc;
    nb::class_<GenerationConfig>(m, "GenerationConfig",
                                 "One generation: budget, sampling, the drafter chain (names of DRAFTERS) and its policy.")
        .def("__init__",
             [](GenerationConfig * self, int32_t max_tokens, float temperature, uint32_t seed,
                std::vector<std::string> drafters, std::string chain_policy, DrafterOptions options, bool server_slot,
                std::string schedule, int32_t window) {
                 new (self) GenerationConfig{max_tokens, temperature, seed, std::move(drafters), std::move(chain_policy),
                                             std::move(options), server_slot, std::move(schedule), window};
             },
             "max_tokens"_a = gc.max_tokens, "temperature"_a = gc.temperature, "seed"_a = gc.seed,
             "drafters"_a = gc.drafters, "chain_policy"_a = gc.chain_policy, "options"_a = gc.options,
             "server_slot"_a = gc.server_slot, "schedule"_a = gc.schedule, "window"_a = gc.window)
        .def_rw("max_tokens", &GenerationConfig::max_tokens)
        .def_rw("temperature", &GenerationConfig::temperature)
        .def_rw("seed", &GenerationConfig::seed)
        .def_rw("drafters", &GenerationConfig::drafters)
        .def_rw("chain_policy", &GenerationConfig::chain_policy)
        .def_rw("options", &GenerationConfig::options,
                "The drafters' options by keyword ({\"ngram_simple_size_n\": 3, \"lookup_cache_static\": \"\", ...}: "
                "integers, or texts for file names): each drafter reads its own keys, "
                "a missing key meaning its default; unknown keys are ignored.")
        .def_rw("schedule", &GenerationConfig::schedule,
                "Each step's draft cap: \"fixed\" (n_max), \"heuristic\" or \"window\" (SCHEDULES)")
        .def_rw("window", &GenerationConfig::window, "The \"window\" schedule's drafting steps")
        .def_rw("server_slot", &GenerationConfig::server_slot,
                "The prompt as a llama-server slot processes it: in the server's prompt batches (for a recurrent, "
                "hybrid or SWA target the last 4 tokens apart), the last batch with the first step, whose token is "
                "sampled before any draft");
    nb::class_<DraftLengthSchedule>(m, "DraftLengthSchedule",
                                    "One generation's draft-length schedule, as the engine runs it (draft_length.h): "
                                    "the what-if replays these rules by driving this class.")
        .def("__init__",
             [](DraftLengthSchedule * self, const std::string & name, int32_t window) {
                 new (self) DraftLengthSchedule(parse_schedule(name, window), window);
             },
             "name"_a, "window"_a = 8)
        .def("length", &DraftLengthSchedule::length, "n_max"_a, "The next step's draft cap at n_max.")
        .def("observe", &DraftLengthSchedule::observe, "drafted"_a, "accepted"_a, "n_max"_a,
             "A step that drafted `drafted` tokens (after the n_min drop) of which `accepted` were accepted.");
    nb::class_<Request>(m, "Request", "One request of a parallel generation: its prompt, config, parameters and arrival step.")
        .def("__init__",
             [](Request * self, std::vector<llama_token> prompt, GenerationConfig config, DraftParams params,
                int32_t arrival) { new (self) Request{std::move(prompt), std::move(config), params, arrival}; },
             "prompt"_a, "config"_a, "params"_a, "arrival"_a = 0)
        .def_rw("prompt", &Request::prompt)
        .def_rw("config", &Request::config)
        .def_rw("params", &Request::params)
        .def_rw("arrival", &Request::arrival);
}

void bind_engine_options(nb::module_ & m) {
    nb::class_<Placement>(m, "Placement",
                          "Where the model's layers go and how its contexts compute (llama.cpp's -ngl, -mg, -lm, "
                          "-fa, -ctk, -ctv, -tb, -nr).")
        .def(nb::init<>())
        .def_rw("n_gpu_layers", &Placement::n_gpu_layers)
        .def_rw("main_gpu", &Placement::main_gpu)
        .def_rw("load_mode", &Placement::load_mode)
        .def_rw("flash_attn", &Placement::flash_attn)
        .def_rw("type_k", &Placement::type_k)
        .def_rw("type_v", &Placement::type_v)
        .def_rw("n_threads_batch", &Placement::n_threads_batch)
        .def_rw("repack", &Placement::repack);
    nb::class_<EngineOptions>(m, "EngineOptions", "How the Engine opens a model.")
        .def(nb::init<>())
        .def_rw("path", &EngineOptions::path)
        .def_rw("draft_path", &EngineOptions::draft_path)
        .def_rw("n_ctx", &EngineOptions::n_ctx)
        .def_rw("n_threads", &EngineOptions::n_threads)
        .def_rw("n_rs_seq", &EngineOptions::n_rs_seq)
        .def_rw("capacity", &EngineOptions::capacity)
        .def_rw("n_parallel", &EngineOptions::n_parallel)
        .def_rw("topk", &EngineOptions::topk)
        .def_prop_rw("telemetry", [](const EngineOptions & o) { return telemetry_name(o.telemetry); },
                     [](EngineOptions & o, const std::string & name) { o.telemetry = telemetry_level(name); })
        .def_rw("cpu_clock", &EngineOptions::cpu_clock)
        .def_rw("placement", &EngineOptions::placement);
    m.attr("FLASH_ATTN_VALUES") = names_tuple(FLASH_ATTN_NAMES);
    m.attr("KV_CACHE_TYPES") = names_tuple(KV_CACHE_TYPE_NAMES);
    m.attr("LOAD_MODES") = names_tuple(LOAD_MODE_NAMES);
    m.attr("TELEMETRY_LEVELS") = names_tuple(TELEMETRY_LEVEL_NAMES);
    m.def("backend_devices", &backend_devices, "The backend devices this build of llama.cpp sees (\"CPU\", \"CUDA0\", ...).");
    m.def("supports_gpu_offload", &llama_supports_gpu_offload, "Whether this build of llama.cpp can offload layers.");
}

// model facts and tokens
void bind_engine_facts(nb::class_<Engine> & c) {
    c.def_prop_ro("closed", &Engine::closed)
        .def_prop_ro("n_vocab", &Engine::n_vocab)
        .def_prop_ro("eog_tokens", &Engine::eog_tokens)
        .def_prop_ro("n_embd", &Engine::n_embd)
        .def_prop_ro("n_ctx", &Engine::n_ctx)
        .def_prop_ro("n_ctx_seq", &Engine::n_ctx_seq)
        .def_prop_ro("n_parallel", &Engine::n_parallel)
        .def_prop_ro("n_layer_nextn", &Engine::n_layer_nextn)
        .def_prop_ro("has_mtp", &Engine::has_mtp)
        .def_prop_ro("has_draft_model", &Engine::has_draft_model)
        .def_prop_ro("draft_kind", [](const Engine & e) { return DRAFTER_NEEDS_NAMES[(int) e.draft_kind()]; },
                     "what the draft model serves: 'draft_model', 'eagle3_head', 'dflash_head', or 'nothing'")
        .def_prop_ro("mtp_head_limit", &Engine::mtp_head_limit,
                     "Chained MTP heads' most draft tokens (llama.cpp caps n_max at the heads); 0 for one head or none")
        .def_prop_ro("draft_block_limit", &Engine::draft_block_limit,
                     "a non-causal DFlash head's most mask slots (block_size - 1): its drafts depend on the block; 0: none")
        .def_prop_ro("is_recurrent", &Engine::is_recurrent)
        .def_prop_ro("checkpoints", &Engine::checkpoints)
        .def_prop_ro("capacity", &Engine::capacity)
        .def_prop_ro("rs_slots", &Engine::rs_slots)
        .def_prop_ro("eos", &Engine::eos)
        .def_prop_ro("n_threads", [](const Engine & e) { return e.options().n_threads; })
        .def_prop_ro("placement", [](const Engine & e) { return e.options().placement; })
        .def_prop_ro("topk", [](const Engine & e) { return e.options().topk; })
        .def_prop_ro("cpu_clock", [](const Engine & e) { return e.options().cpu_clock; })
        .def_prop_rw("telemetry", [](const Engine & e) { return telemetry_name(e.telemetry()); },
                     [](Engine & e, const std::string & name) { e.set_telemetry(telemetry_level(name)); })
        .def("is_eog", &Engine::is_eog)
        .def("tokenize", &Engine::tokenize, "text"_a, "add_special"_a = false)
        .def("detokenize", &Engine::detokenize)
        .def("piece", &Engine::piece);
}

// ---- interrupts: Python's signal handlers run between the steps of a long call -------------------------

// How often a long call on Python's main thread takes the GIL to run pending signal handlers, at most
// (benchmarks/interrupt_cost.py measures what the checks cost; 0 turns them off).
std::chrono::microseconds signal_check_interval{10000};

bool on_main_thread() {
    static const unsigned long main_ident =
        nb::cast<unsigned long>(nb::module_::import_("threading").attr("main_thread")().attr("ident"));
    return PyThread_get_thread_ident() == main_ident;
}

// Installed in the engine for one long call made on Python's main thread (where Python runs signal handlers):
// between steps it takes the GIL and runs the pending handlers (PyErr_CheckSignals). A handler that raises
// (SIGINT's: KeyboardInterrupt) stops the call as cancel() would, and its exception is kept to be raised when
// the call has returned.
class SignalChecks {
  public:
    explicit SignalChecks(Engine & e) : engine(e) {
        if (signal_check_interval.count() > 0 && on_main_thread()) {
            engine.set_interrupt_check([this] { return check(); });
        }
    }
    ~SignalChecks() {  // the GIL held
        engine.set_interrupt_check(nullptr);
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(traceback);
    }
    SignalChecks(const SignalChecks &) = delete;
    SignalChecks & operator=(const SignalChecks &) = delete;

    // the GIL held: raises the exception a handler raised during the call, if one did
    void raise_pending() {
        if (type != nullptr) {
            PyErr_Restore(type, value, traceback);
            type = value = traceback = nullptr;
            throw nb::python_error();
        }
    }

  private:
    bool check() {
        if (type != nullptr) {  // asked again after a handler raised (a decode that finished anyway): still stop
            return true;
        }
        const auto now = std::chrono::steady_clock::now();
        if (now < next_check) {
            return false;
        }
        next_check = now + signal_check_interval;
        nb::gil_scoped_acquire gil;
        if (PyErr_CheckSignals() == 0) {
            return false;
        }
        PyErr_Fetch(&type, &value, &traceback);
        return true;
    }

    Engine & engine;
    std::chrono::steady_clock::time_point next_check = std::chrono::steady_clock::now() + signal_check_interval;
    PyObject * type = nullptr;
    PyObject * value = nullptr;
    PyObject * traceback = nullptr;
};

// Runs `work` (which touches no Python object) with the GIL released and the engine checking for signals; a
// signal handler's exception is raised once it has returned, in place of whatever it returned or threw.
template <class Work> void interruptible(Engine & e, Work && work) {
    SignalChecks checks(e);
    std::exception_ptr failure;
    try {
        nb::gil_scoped_release release;
        work();
    } catch (...) {
        failure = std::current_exception();
    }
    checks.raise_pending();  // before the engine's own error (an INTERRUPTED one without it: CancelledError)
    if (failure) {
        std::rethrow_exception(failure);
    }
}

// run_mutex for a call that holds the GIL: waited for with the GIL released, since a long call holds run_mutex
// while it takes the GIL to check for signals
std::unique_lock<std::mutex> lock_run(const Engine & e) {
    std::unique_lock<std::mutex> lk(e.run_mutex, std::try_to_lock);
    if (!lk.owns_lock()) {
        nb::gil_scoped_release release;
        lk.lock();
    }
    return lk;
}

// generation: the long calls release the GIL (their arguments copied first); begin, run, record_oracle and the
// probes check for signals between steps (and a prompt's decode between its graph nodes)
void bind_engine_generation(nb::class_<Engine> & c) {
    c.def("close", [](Engine & e) { nb::gil_scoped_release r; e.close(); })
        .def("begin",
             [](Engine & e, const std::vector<llama_token> & prompt, const GenerationConfig & config,
                const DraftParams & params) {
                 const GenerationConfig cfg = config;
                 const DraftParams p = params;
                 interruptible(e, [&] { e.begin(prompt, cfg, p); });
             },
             "prompt"_a, "config"_a, "params"_a)
        .def("begin_requests",
             [](Engine & e, const std::vector<Request> & requests) {
                 const std::vector<Request> copy = requests;
                 interruptible(e, [&] { e.begin_requests(copy); });
             },
             "requests"_a)
        .def("step", [](Engine & e) { nb::gil_scoped_release r; return e.step(); })
        .def("run", [](Engine & e) { interruptible(e, [&] { e.run(); }); })
        .def("record_oracle",
             [](Engine & e, const std::vector<llama_token> & prompt, int32_t max_tokens, int32_t depth,
                const DrafterOptions & options, bool probe) {
                 const DrafterOptions opts = options;
                 OracleRecord rec;
                 bool done = false;
                 interruptible(e, [&] { done = e.record_oracle(prompt, max_tokens, depth, opts, probe, rec); });
                 return nb::make_tuple(done, columns_dict(rec, 0));
             },
             "prompt"_a, "max_tokens"_a, "depth"_a, "options"_a, "probe"_a = true)
        .def("probe_batch_shift",
             [](Engine & e, const std::vector<llama_token> & tokens, const std::vector<int32_t> & ks) {
                 BatchShiftRecord rec;
                 interruptible(e, [&] { e.probe_batch_shift(tokens, ks, rec); });
                 const size_t P = rec.top1.size(), K = rec.ks.size();
                 nb::dict d;
                 d["ks"] = column(rec.ks, 0, K, {});
                 d["position"] = column(rec.position, 0, P, {});
                 d["top1"] = column(rec.top1, 0, P, {});
                 d["margin"] = column(rec.margin, 0, P, {});
                 d["margin_shift"] = column(rec.margin_shift, 0, K, {P});
                 d["logit_shift"] = column(rec.logit_shift, 0, K, {P});
                 d["flip"] = column(rec.flip, 0, K, {P});
                 return d;
             },
             "tokens"_a, "ks"_a,
             "How far the target's logits move between one-row and k-row decodes of the same tokens (batch_shift.h).")
        .def("probe_layer_inputs",
             [](Engine & e, const std::vector<llama_token> & tokens, const std::vector<int32_t> & layers) {
                 std::vector<float> rows;
                 interruptible(e, [&] { e.probe_layer_inputs(tokens, layers, rows); });
                 const size_t L = layers.size(), P = tokens.size();
                 return column(rows, 0, P, {L, rows.size() / std::max<size_t>(1, P * L)});
             },
             "tokens"_a, "layers"_a,
             "The inputs of the target's trunk layers for every token ([tokens, layers, n_embd]; layer_inputs.h).")
        .def_prop_ro("arch", &Engine::arch)
        .def("set_params", &Engine::set_params, "params"_a)
        .def("params", &Engine::params)
        .def("cancel", &Engine::cancel);
}

// results: per request (0: a single generation's) the trace, the tokens, the drafters' statistics
void bind_engine_results(nb::class_<Engine> & c) {
    c.def("columns", [](const Engine & e, size_t row0, size_t request) {
             const auto lk = lock_run(e);
             return columns_dict(e.request(request).tel, row0);
         }, "row0"_a = 0, "request"_a = 0)
        .def_prop_ro("n_rows", [](const Engine & e) { return e.requests().empty() ? (size_t) 0 : e.tel().rows(); })
        .def("generated", [](const Engine & e, size_t from, size_t request) {
                 const auto lk = lock_run(e);
                 const std::vector<llama_token> & g = e.request(request).generated;
                 return std::vector<llama_token>(g.begin() + std::min(from, g.size()), g.end());
             }, "from"_a = 0, "request"_a = 0)
        .def("drafter_stats", [](const Engine & e, size_t request) {
                 const auto lk = lock_run(e);
                 return drafter_stats(e.request(request));
             }, "request"_a = 0)
        .def("request_state", [](const Engine & e, size_t request) {
                 const auto lk = lock_run(e);
                 const Sequence & q = e.request(request);
                 nb::dict d;
                 d["n_rows"] = q.tel.rows();
                 d["n_generated"] = q.generated.size();
                 d["finish"] = (int) q.finish;
                 d["slot"] = q.slot;
                 d["arrival"] = q.request.arrival;
                 d["admitted_step"] = q.admitted_step;
                 d["finished_step"] = q.finished_step;
                 d["t_prefill_ns"] = q.t_prefill_ns;
                 d["n_prompt"] = q.request.prompt.size();
                 const RequestTotals & t = q.totals;
                 nb::dict totals;
                 totals["n_steps"] = t.n_steps;
                 totals["n_drafted"] = t.n_drafted;
                 totals["n_accepted"] = t.n_accepted;
                 totals["t_catchup_ns"] = t.t_catchup_ns;
                 totals["t_draft_ns"] = t.t_draft_ns;
                 totals["t_verify_ns"] = t.t_verify_ns;
                 totals["t_sample_ns"] = t.t_sample_ns;
                 d["totals"] = totals;
                 return d;
             }, "request"_a,
             "One request's progress: rows, tokens, finish (FINISH_REASONS index, -1 running), the slot (sequence) it "
             "took (-1: none yet), its arrival, admission and finish steps, prefill time and prompt length, and its totals "
             "over its steps (kept at every telemetry level).")
        .def_prop_ro("n_requests", [](const Engine & e) { return e.requests().size(); })
        .def_prop_ro("n_generated", [](const Engine & e) { return e.generated().size(); })
        .def_prop_ro("finish", [](const Engine & e) { return (int) e.finish(); })
        .def_prop_ro("t_prefill_ns", [](const Engine & e) { return e.t_prefill_ns(); })
        .def_prop_ro("n_prompt", [](const Engine & e) { return e.n_prompt(); });
}

// a look-up drafter walked along a recorded path (the what-if's replay of the stateful look-ups)
void bind_lookup_walk(nb::module_ & m) {
    nb::class_<LookupWalk>(m, "LookupWalk",
                           "A look-up drafter of the engine walked along a recorded greedy path with no model.")
        .def("__init__",
             [](LookupWalk * self, const std::string & name, const DrafterOptions & options,
                std::vector<llama_token> path, int32_t n_prompt, int32_t n_vocab, std::vector<llama_token> eog) {
                 LookupVocab vocab;
                 vocab.n_tokens = n_vocab;
                 std::sort(eog.begin(), eog.end());
                 vocab.eog = std::move(eog);
                 new (self) LookupWalk(name, options, std::move(path), n_prompt, std::move(vocab));
             },
             "name"_a, "options"_a, "path"_a, "n_prompt"_a, "n_vocab"_a, "eog"_a)
        .def("propose",
             [](LookupWalk & w, int32_t g, int32_t n_cap, int32_t cap_reason, int32_t n_min) -> nb::object {
                 if (cap_reason < 0 || cap_reason > STOP_EXHAUSTED) {
                     fail(ErrorKind::PARAMETER, "cap_reason must index STOP_REASONS");
                 }
                 if (!w.propose(g, n_cap, (StopReason) cap_reason, n_min)) {
                     return nb::none();
                 }
                 const Draft & d = w.draft();
                 return nb::make_tuple(nb::cast(d.tokens), (int) d.stop);
             },
             "g"_a, "n_cap"_a, "cap_reason"_a, "n_min"_a,
             "The draft at position g under a cap: (tokens, stop reason), or None where it takes no part (n_cap 0).")
        .def("told", &LookupWalk::told, "g"_a, "took_part"_a, "last"_a, "n_accepted"_a, "replay"_a,
             "The step at position g ended: the drafter learns its outcome as the engine tells it.")
        .def_prop_ro("positions", &LookupWalk::positions)
        .def_prop_ro("n_resets", &LookupWalk::n_resets, "Times the drafter forgot what it learned along the walk.");
}

void bind_engine(nb::module_ & m) {
    m.def("signal_check_interval", [] { return (double) signal_check_interval.count() * 1e-6; },
          "Seconds between a long call's checks for signals, at most (0: no checks).");
    m.def("set_signal_check_interval",
          [](double seconds) {
              if (!(seconds >= 0.0 && seconds <= 10.0)) {
                  fail(ErrorKind::PARAMETER, "the signal check interval must be between 0 and 10 s");
              }
              signal_check_interval = std::chrono::microseconds((int64_t) (seconds * 1e6));
          },
          "seconds"_a, "How often run, record_oracle and the probes check for signals on Python's main thread, at "
                       "most (0: never; for measuring what the checks cost).");
    nb::class_<Engine> c(m, "Engine");
    c.def("__init__", [](Engine * self, const EngineOptions & options) {
        const EngineOptions o = options;
        nb::gil_scoped_release release;
        new (self) Engine(o);
    }, "options"_a);
    bind_engine_facts(c);
    bind_engine_generation(c);
    bind_engine_results(c);
}

}  // namespace

NB_MODULE(_native, m) {
    m.doc() = "mtp-explorer native engine: llama.cpp MTP speculative decoding with per-step telemetry";
    llama_log_set(log_callback, nullptr);
    llama_backend_init();
    bind_errors(m);
    bind_functions(m);
    bind_tables(m);
    bind_draft_configs(m);
    bind_generation_config(m);
    bind_engine_options(m);
    bind_engine(m);
    bind_lookup_walk(m);
}
