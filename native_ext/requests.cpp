// Requests and slots: a request waits until its arrival step and a free sequence, takes it (its
// prompt prefilled on the target and its drafters begun on that seq_id), and leaves it when it
// finishes, as llama-server's slots take and release tasks.
#include <algorithm>

#include "engine.h"
#include "errors.h"
#include "timing.h"

Sequence::Sequence(int32_t index, const Request & request, const DrafterChain & chain, int32_t depth, int32_t topk)
    : index(index), request(request), chain(chain), params(request.params),
      schedule(parse_schedule(request.config.schedule, request.config.window), request.config.window) {
    tel.depth = depth;
    tel.topk = topk;
    candidates.resize(N_DRAFTERS);
    asked.assign(N_DRAFTERS, 0);
    expected.assign(N_DRAFTERS, 0.0);
}

void Engine::end_generations() {
    for (auto & q : reqs) {
        if (q->finish == FINISH_NONE) {
            q->finish = FINISH_CANCELLED;
        }
    }
    std::fill(slots.begin(), slots.end(), nullptr);
    active.clear();
}

// Every memory emptied for a new generation: its cells only (data false), as llama-server empties a slot
// (seq_rm): a cell's old K/V rows are masked until written again and a recurrent cell taken anew starts from
// llama.cpp's zeroed state (rs_z), so the buffers need no clearing. Clearing them wrote every byte of the KV
// cache and the snapshot slots at each begin: about 9 ms on the 0.4 B scale model at n_ctx 2048, more with
// the context, and none of it in the reference's timed decode.
void Engine::clear_memories() {
    for (llama_context * ctx : {ctx_tgt.get(), ctx_mtp.get(), ctx_dft.get()}) {
        if (ctx != nullptr) {
            llama_memory_clear(llama_get_memory(ctx), /*data*/ false);
        }
    }
}

// the earliest arrival step of a waiting request (-1: none waits)
int32_t Engine::next_arrival() const {
    int32_t next = -1;
    for (const auto & q : reqs) {
        if (q->waiting() && (next < 0 || q->request.arrival < next)) {
            next = q->request.arrival;
        }
    }
    return next;
}

// waiting requests that have arrived by `step`, in request order, into the free sequences in slot order
void Engine::admit(int32_t step) {
    for (auto & q : reqs) {
        if (!q->waiting() || q->request.arrival > step) {
            continue;
        }
        const auto free = std::find(slots.begin(), slots.end(), nullptr);
        if (free == slots.end()) {
            return;
        }
        *free = q.get();
        q->slot = (llama_seq_id) (free - slots.begin());
        q->admitted_step = step;
        for (auto & d : q->drafters) {
            d->seq_id = q->slot;
        }
        if (q->request.config.temperature > 0.0f) {
            q->smpl.reset(llama_sampler_chain_init(llama_sampler_chain_default_params()));
            llama_sampler_chain_add(q->smpl.get(), llama_sampler_init_temp(q->request.config.temperature));
            llama_sampler_chain_add(q->smpl.get(), llama_sampler_init_dist(q->request.config.seed));
        }
        prefill(*q);
    }
}

// Where llama-server 0.3.36 ends its prompt batches (update_slots): at most n_batch tokens each, and for a target
// whose memory it checkpoints (recurrent, hybrid or SWA) a batch also ends 4 + n_ubatch and 4 tokens before the
// prompt's end, so that a checkpoint can be made there. Returns each batch's end.
std::vector<int32_t> server_prompt_chunks(int32_t n, int32_t n_batch, int32_t n_ubatch, bool checkpoints) {
    std::vector<int32_t> ends;
    for (int32_t start = 0; start < n;) {
        int32_t end = start;
        while (end < n && end - start < n_batch) {
            ++end;
            const int32_t left = n - end;
            if (checkpoints && (left == std::min(n_batch, 4 + n_ubatch) || left == std::min(n_batch, 4))) {
                break;
            }
        }
        ends.push_back(end);
        start = end;
    }
    return ends;
}

// The prompt on the target in the request's sequence, every drafter begun (the drafters follow it: the MTP head
// catches up when it drafts): all of it but its last token, as llama-speculative-simple does; or, for a server
// slot, its prompt batches but the last, whose rows the first step decodes before its token (n_prompt_pending).
void Engine::prefill(Sequence & q) {
    const std::vector<llama_token> & prompt = q.request.prompt;
    const int32_t N = (int32_t) prompt.size();
    const int64_t t0 = now_ns();
    llama_memory_seq_rm(llama_get_memory(ctx_tgt.get()), q.slot, -1, -1);
    for (auto & d : q.drafters) {
        const int64_t t = wall_ns();
        d->begin(prompt);
        d->stats.t_begin_ns += wall_ns() - t;
        d->stats.n_call_begin++;
    }
    q.tokens_all = prompt;
    int32_t n_before = N - 1;  // prompt tokens decoded here, in batches ending at `ends`
    std::vector<int32_t> ends{n_before};
    if (q.request.config.server_slot) {
        const bool checkpoints = recurrent || llama_model_n_swa(model.get()) > 0;
        ends = server_prompt_chunks(N, std::min(SERVER_N_BATCH, (int32_t) llama_n_batch(ctx_tgt.get())),
                                    (int32_t) llama_n_ubatch(ctx_tgt.get()), checkpoints);
        ends.pop_back();
        n_before = ends.empty() ? 0 : ends.back();
    }
    int32_t start = 0;
    for (const int32_t end : ends) {
        if (end <= start) {
            continue;
        }
        llama_batch_ext_clear(batch_tgt.get());
        add_target_rows(q.slot, prompt.data() + start, end - start, start, /*logits*/ false);
        // a long prompt is one decode: it is interrupted between its graph nodes (llama.cpp returns 2, aborted)
        const bool abortable = (bool) interrupt_check;
        if (abortable) {
            llama_set_abort_callback(ctx_tgt.get(), &Engine::prompt_aborted, this);
        }
        const int32_t rc = llama_process(ctx_tgt.get(), LLAMA_PROCESS_TYPE_DECODE, batch_tgt.get());
        if (abortable) {
            llama_set_abort_callback(ctx_tgt.get(), nullptr, nullptr);
            if (rc == 2) {
                llama_memory_seq_rm(llama_get_memory(ctx_tgt.get()), q.slot, -1, -1);
                fail(ErrorKind::INTERRUPTED, "interrupted");
            }
        }
        check_decode(rc, "prompt decode");
        follow_target(q, prompt.data() + start, end - start, start, 0);
        if (q.params.n_max > 0) {
            catch_up_drafters(drafters_of(q), "prompt catch-up");
        }
        for (auto & d : q.drafters) {
            d->keep(end - start - 1, end);
        }
        start = end;
    }
    q.id_last = prompt[N - 1];
    q.n_past = n_before;
    q.n_prompt_pending = N - 1 - n_before;
    q.t_prefill_ns = now_ns() - t0;
}

// A finished request leaves its sequence (if it had taken one): its rows leave the target, MTP and draft memories.
void Engine::release(Sequence & q) {
    if (q.slot < 0 || slots[(size_t) q.slot] != &q) {
        return;
    }
    for (llama_context * ctx : {ctx_tgt.get(), ctx_mtp.get(), ctx_dft.get()}) {
        if (ctx != nullptr) {
            llama_memory_seq_rm(llama_get_memory(ctx), q.slot, -1, -1);
        }
    }
    slots[(size_t) q.slot] = nullptr;
    q.smpl.reset();
}
