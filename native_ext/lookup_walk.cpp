#include "lookup_walk.h"

#include <algorithm>

#include "errors.h"

LookupWalk::LookupWalk(const std::string & name, const DrafterOptions & options_, std::vector<llama_token> path_,
                       int32_t n_prompt_, LookupVocab vocab_)
    : path(std::move(path_)), n_prompt(n_prompt_), vocab(std::move(vocab_)), options(options_) {
    const int32_t id = drafter_index(name);
    if (id < 0) {
        fail(ErrorKind::PARAMETER, "unknown drafter \"" + name + "\"; the engine has " + drafter_names_list());
    }
    if (DRAFTER_TABLE[id].needs != DrafterNeeds::NOTHING) {
        fail(ErrorKind::PARAMETER, "\"" + name + "\" drafts with a model: only the look-ups are walked without one");
    }
    if (n_prompt < 1 || n_prompt > (int32_t) path.size()) {
        fail(ErrorKind::PARAMETER, "a walk needs a prompt of at least one token within its path");
    }
    DrafterSetup setup;
    setup.id = (DrafterId) id;
    setup.lookup_vocab = &vocab;
    setup.options = &options;
    drafter = DRAFTER_TABLE[id].make(setup);
    drafter->begin(std::vector<llama_token>(path.begin(), path.begin() + n_prompt));
}

int32_t LookupWalk::n_history(int32_t g) const {
    if (g < 0 || g >= positions()) {
        fail(ErrorKind::PARAMETER, "position " + std::to_string(g) + " outside the walk's [0, " +
                                       std::to_string(positions()) + ")");
    }
    return n_prompt - 1 + g;
}

bool LookupWalk::propose(int32_t g, int32_t n_cap, StopReason cap_reason, int32_t n_min) {
    DraftRequest req;
    req.n_past = n_history(g);
    req.id_last = path[req.n_past];
    req.history = path.data();
    req.n_history = (size_t) req.n_past;
    req.n_cap = n_cap;
    req.cap_reason = cap_reason;
    req.params.n_min = n_min;
    last_draft.clear(cap_reason);
    return drafter->draft(req, last_draft);
}

void LookupWalk::told(int32_t g, bool took_part, bool last, int32_t n_accepted, bool replay) {
    const int32_t first = n_history(g) + 1;  // the tokens the step emitted follow its last sampled token
    DraftOutcome outcome;
    outcome.proposal = took_part && !replay ? &last_draft : nullptr;
    outcome.verified = last && !replay;
    outcome.last = last;
    outcome.n_drafted = took_part ? (int32_t) last_draft.tokens.size() : 0;
    outcome.n_accepted = n_accepted;
    outcome.emitted = path.data() + std::min(first, (int32_t) path.size());
    outcome.n_emitted = std::max(0, std::min(n_accepted + 1, (int32_t) path.size() - first));
    outcome.keep_until = first + n_accepted;
    outcome.replay = replay;
    drafter->accept(outcome);
}
