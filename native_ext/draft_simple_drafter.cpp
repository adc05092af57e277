#include "draft_simple_drafter.h"

#include <algorithm>

#include "errors.h"
#include "timing.h"

DraftSimpleDrafter::DraftSimpleDrafter(DrafterId id, llama_context * ctx_dft) : Drafter(id), ctx_dft(ctx_dft) {
    if (ctx_dft == nullptr) {
        fail(ErrorKind::PARAMETER, "draft-simple needs a draft model: Session.open(path, draft_model=...)");
    }
    vocab = llama_model_get_vocab(llama_get_model(ctx_dft));
    batch.reset(llama_batch_ext_init(ctx_dft));
}

void DraftSimpleDrafter::begin(const std::vector<llama_token> & /*prompt*/) {
    llama_memory_seq_rm(llama_get_memory(ctx_dft), seq_id, -1, -1);
}

void DraftSimpleDrafter::observe_target(const TargetRows & rows) {
    if (rows.n <= 0) {
        return;
    }
    llama_batch_ext_clear(batch.get());
    for (int32_t i = 0; i < rows.n; ++i) {
        const int32_t idx = llama_batch_ext_add_token(batch.get(), seq_id, rows.toks[i]);
        const llama_pos pos = rows.pos0 + i;
        llama_batch_ext_set_pos(batch.get(), idx, &pos);
        llama_batch_ext_set_output_logits(batch.get(), idx, i == rows.n - 1);
    }
    check_decode(llama_process(ctx_dft, LLAMA_PROCESS_TYPE_DECODE, batch.get()), "draft model decode");
}

void DraftSimpleDrafter::set_row(llama_token tok, llama_pos pos) {
    llama_batch_ext_clear(batch.get());
    const int32_t idx = llama_batch_ext_add_token(batch.get(), seq_id, tok);
    llama_batch_ext_set_pos(batch.get(), idx, &pos);
    llama_batch_ext_set_output_logits(batch.get(), idx, true);
}

bool DraftSimpleDrafter::draft(const DraftRequest & req, Draft & out) {
    if (req.n_cap <= 0) {
        return true;
    }
    out.clear(req.cap_reason);
    const int32_t n_vocab = llama_vocab_n_tokens(vocab);
    const llama_pos pos0 = req.n_past;
    const int64_t t_start = req.oracle ? now_ns() : 0;
    set_row(req.id_last, pos0);
    for (int32_t i = 0;; ++i) {
        const int32_t rc = llama_process(ctx_dft, LLAMA_PROCESS_TYPE_DECODE, batch.get());
        out.n_decodes++;
        if (rc != 0) {
            llama_memory_seq_rm(llama_get_memory(ctx_dft), seq_id, pos0, -1);
            check_decode(rc, "draft model draft decode");
        }
        const float * logits = llama_get_logits_ith(ctx_dft, 0);
        ranking.rank(logits, n_vocab);
        if (!ranking.take(req, logits, t_start, out) || CandidateRanking::ended(req, vocab, out)) {
            break;
        }
        set_row(ranking.top(), pos0 + i + 1);
    }
    // the drafted rows leave the draft context: the verify batch is decoded on it as on the target
    llama_memory_seq_rm(llama_get_memory(ctx_dft), seq_id, pos0, -1);
    if ((int32_t) out.tokens.size() < req.params.n_min) {
        out.dropped = true;
    }
    return true;
}

void DraftSimpleDrafter::accept(const DraftOutcome & outcome) {
    llama_memory_seq_rm(llama_get_memory(ctx_dft), seq_id, outcome.keep_until, -1);
}
