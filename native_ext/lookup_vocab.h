// What a look-up drafter knows of the vocabulary: its size and its end-of-generation tokens. The engine takes
// them from the model (LookupVocab::of); the what-if's replay (LookupWalk) from an oracle recording, with no model.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "llama.h"

struct LookupVocab {
    int32_t n_tokens = 0;
    std::vector<llama_token> eog;  // sorted: the tokens llama_vocab_is_eog holds

    // Every token of `vocab` asked once (llama_vocab_is_eog).
    static LookupVocab of(const llama_vocab * vocab) {
        LookupVocab v;
        v.n_tokens = llama_vocab_n_tokens(vocab);
        for (llama_token t = 0; t < v.n_tokens; ++t) {
            if (llama_vocab_is_eog(vocab, t)) {
                v.eog.push_back(t);
            }
        }
        return v;
    }

    bool is_eog(llama_token t) const { return std::binary_search(eog.begin(), eog.end(), t); }
};
