// The drafter table: every drafter the engine knows, in DrafterId order, with its factory. The
// names (_native.DRAFTERS), the count of per-source columns, the chain's parsing, the factory the
// engine calls and the oracle's recording list all come from here.
//
// Adding a drafter: its class (a Drafter, in its own files; it reads its options from
// DrafterSetup::options with its own defaults, declares the target features it reads in features() and
// gets them in observe_target()) and one entry below (with its batch functions if the drafters of several
// sequences decode together); CMake compiles every native_ext/*.cpp. On the Python side: its record in core/drafters.py
// and, for a drafter with a model, its replay in analysis/replay.py (the what-if walks a look-up itself: lookup_walk.h).
#include <memory>

#include "draft_simple_drafter.h"
#include "dflash_drafter.h"
#include "drafter.h"
#include "eagle3_drafter.h"
#include "mtp_drafter.h"
#include "errors.h"
#include "ngram_cache_drafter.h"
#include "ngram_drafter.h"
#include "ngram_map_drafter.h"
#include "ngram_mod_drafter.h"

namespace {

std::unique_ptr<Drafter> make_mtp(const DrafterSetup & s) {
    return std::make_unique<MtpDrafter>(*s.api, s.ctx_mtp, *s.probe_mtp);
}

std::unique_ptr<Drafter> make_ngram_simple(const DrafterSetup & s) {
    return std::make_unique<NgramSimpleDrafter>(s.id, *s.lookup_vocab, NgramConfig::from(*s.options));
}

std::unique_ptr<Drafter> make_ngram_mod(const DrafterSetup & s) {
    return std::make_unique<NgramModDrafter>(s.id, *s.lookup_vocab, NgramModConfig::from(*s.options));
}

std::unique_ptr<Drafter> make_ngram_map_k(const DrafterSetup & s) {
    return std::make_unique<NgramMapDrafter>(s.id, *s.lookup_vocab, NgramMapConfig::from(*s.options, "ngram_map_k", true));
}

std::unique_ptr<Drafter> make_ngram_map_k4v(const DrafterSetup & s) {
    return std::make_unique<NgramMapDrafter>(s.id, *s.lookup_vocab, NgramMapConfig::from(*s.options, "ngram_map_k4v", false));
}

std::unique_ptr<Drafter> make_ngram_cache(const DrafterSetup & s) {
    return std::make_unique<NgramCacheDrafter>(s.id, *s.lookup_vocab, NgramCacheConfig::from(*s.options));
}

std::unique_ptr<Drafter> make_draft_simple(const DrafterSetup & s) {
    return std::make_unique<DraftSimpleDrafter>(s.id, s.ctx_dft);
}

std::unique_ptr<Drafter> make_draft_eagle3(const DrafterSetup & s) {
    return std::make_unique<Eagle3Drafter>(s.id, *s.api, s.ctx_dft, *s.head);
}

std::unique_ptr<Drafter> make_draft_dflash(const DrafterSetup & s) {
    return std::make_unique<DFlashDrafter>(s.id, *s.api, s.ctx_dft, *s.head);
}

}  // namespace

// (declared extern in drafter.h, so defined here with external linkage)
// name (llama.cpp's --spec-type), what it needs, whether it has a confidence, its factory (and batch functions)
constexpr DrafterEntry DRAFTER_TABLE[] = {
    {"draft-mtp", DrafterNeeds::MTP, true, make_mtp,  // the model's MTP head (DRAFTER_MTP)
     MtpDrafter::draft_together, MtpDrafter::catch_up_together},
    {"ngram-simple", DrafterNeeds::NOTHING, false, make_ngram_simple},     // prompt look-up
    {"ngram-mod", DrafterNeeds::NOTHING, false, make_ngram_mod},           // hashed n-gram table
    {"ngram-map-k", DrafterNeeds::NOTHING, false, make_ngram_map_k},       // key map
    {"ngram-map-k4v", DrafterNeeds::NOTHING, false, make_ngram_map_k4v},   // key/value map
    {"ngram-cache", DrafterNeeds::NOTHING, false, make_ngram_cache},       // n-gram statistics
    {"draft-simple", DrafterNeeds::DRAFT_MODEL, true, make_draft_simple},  // a draft model
    {"draft-eagle3", DrafterNeeds::EAGLE3_HEAD, true, make_draft_eagle3},  // an EAGLE-3 head
    {"draft-dflash", DrafterNeeds::DFLASH_HEAD, true, make_draft_dflash},  // a DFlash block drafter
    {"draft-dspark", DrafterNeeds::DSPARK_HEAD, true, make_draft_dflash},  // DFlash + a Markov head
};
static_assert(DRAFTER_TABLE[DRAFTER_MTP].make == make_mtp, "the MTP drafter is DRAFTER_MTP");
const int32_t N_DRAFTERS = (int32_t) (sizeof(DRAFTER_TABLE) / sizeof(DRAFTER_TABLE[0]));

const char * drafter_name(int32_t id) { return DRAFTER_TABLE[id].name; }

int32_t option_or(const DrafterOptions & options, const char * key, int32_t fallback) {
    const auto it = options.find(key);
    if (it == options.end()) {
        return fallback;
    }
    if (const int32_t * value = std::get_if<int32_t>(&it->second)) {
        return *value;
    }
    fail(ErrorKind::PARAMETER, std::string("the drafter option ") + key + " must be an integer");
}

std::string option_text(const DrafterOptions & options, const char * key) {
    const auto it = options.find(key);
    if (it == options.end()) {
        return "";
    }
    if (const std::string * value = std::get_if<std::string>(&it->second)) {
        return *value;
    }
    fail(ErrorKind::PARAMETER, std::string("the drafter option ") + key + " must be a text (a file name)");
}

int32_t drafter_index(const std::string & name) {
    for (int32_t i = 0; i < N_DRAFTERS; ++i) {
        if (name == DRAFTER_TABLE[i].name) {
            return i;
        }
    }
    return -1;
}

std::string drafter_names_list() {
    std::string out;
    for (int32_t i = 0; i < N_DRAFTERS; ++i) {
        out += (i ? ", \"" : "\"") + std::string(DRAFTER_TABLE[i].name) + "\"";
    }
    return out;
}
