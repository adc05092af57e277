// The scans over one row of logits that the engine makes on the CPU every step: the greedy token of each verify row
// and the draft candidates of each draft decode. At a 248 k vocabulary a row is 1 MB, so each scan reads it once, in
// chunks whose maximum (vectorised) decides whether any of its logits can change the answer.
#pragma once

#include <cstdint>

#include "llama.h"

// The index of the largest of n_vocab logits, the first of equal ones (std::max_element's; NaN never wins, and a row
// of NaN gives 0).
llama_token argmax(const float * logits, int32_t n_vocab);

// The k largest of n_vocab logits (k at most n_vocab), largest first and equal ones by increasing id, into ids[0..k)
// and vals[0..k).
void top_logits(const float * logits, int32_t n_vocab, int32_t k, int32_t * ids, float * vals);
