// A look-up drafter walked along a recorded greedy path with no model: how the what-if replays the drafters whose
// drafts depend on what they saw (ngram-mod's table, ngram-map's key statistics, ngram-cache's context cache). It
// is the class the engine runs (DRAFTER_TABLE's factory), asked and told position by position as the engine asks
// and tells it on that path, so the replay has no second implementation to keep equal.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "draft.h"
#include "drafter.h"
#include "lookup_vocab.h"

class LookupWalk {
  public:
    // A new generation of drafter `name` (a look-up of DRAFTER_TABLE) with `options` over `path`: the prompt's
    // n_prompt tokens, then the greedy path's. Position g's history is path[0, n_prompt - 1 + g) and its last
    // sampled token path[n_prompt - 1 + g]. Throws a parameter error for an unknown drafter, one that needs a
    // model, a bad option or an unreadable cache file.
    LookupWalk(const std::string & name, const DrafterOptions & options, std::vector<llama_token> path,
               int32_t n_prompt, LookupVocab vocab);

    // The drafter asked at position g under a draft cap (the engine's DraftRequest); false when it takes no part
    // (n_cap 0). Its proposal is then draft().
    bool propose(int32_t g, int32_t n_cap, StopReason cap_reason, int32_t n_min);
    const Draft & draft() const { return last_draft; }

    // The step at g ended (Drafter::accept): `took_part`: it proposed at g; `last`: its draft is the one verified
    // last (llama.cpp's impl_last); `replay`: a checkpoint replay, whose n_accepted tokens llama.cpp tells only
    // now; n_accepted: the step's accepted tokens (the path's tokens after g's last sampled token were emitted).
    void told(int32_t g, bool took_part, bool last, int32_t n_accepted, bool replay);

    int32_t positions() const { return (int32_t) path.size() - n_prompt + 1; }
    int64_t n_resets() const { return drafter->stats.n_resets; }  // DrafterStats::n_resets along the walk

  private:
    int32_t n_history(int32_t g) const;

    std::vector<llama_token> path;
    int32_t n_prompt;
    LookupVocab vocab;  // before the drafter, which holds a reference to it
    DrafterOptions options;
    std::unique_ptr<Drafter> drafter;
    Draft last_draft;
};
