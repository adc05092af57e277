// The drafter table: every drafter the engine knows, in DrafterId order, with its factory. The
// names (_native.DRAFTERS), the count of per-source columns, the chain's parsing, the factory the
// engine calls and the oracle's recording list all come from here.
//
// Adding a drafter: its class (a Drafter, in its own files; it reads its options from
// DrafterSetup::options with its own defaults, declares the target features it reads in features() and
// gets them in observe_target()) and one entry below (with its batch functions if the drafters of several
// sequences decode together); CMake compiles every native_ext/*.cpp. On the Python side: its record in core/drafters.py, its replay in
// analysis/replay.py.
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
    return std::make_unique<NgramSimpleDrafter>(s.id, s.vocab, NgramConfig::from(*s.options));
}

std::unique_ptr<Drafter> make_ngram_mod(const DrafterSetup & s) {
    return std::make_unique<NgramModDrafter>(s.id, s.vocab, NgramModConfig::from(*s.options));
}

std::unique_ptr<Drafter> make_ngram_map_k(const DrafterSetup & s) {
    return std::make_unique<NgramMapDrafter>(s.id, s.vocab, NgramMapConfig::from(*s.options, "ngram_map_k", true));
}

std::unique_ptr<Drafter> make_ngram_map_k4v(const DrafterSetup & s) {
    return std::make_unique<NgramMapDrafter>(s.id, s.vocab, NgramMapConfig::from(*s.options, "ngram_map_k4v", false));
}

std::unique_ptr<Drafter> make_ngram_cache(const DrafterSetup & s) {
    return std::make_unique<NgramCacheDrafter>(s.id, s.vocab, NgramCacheConfig::from(*s.options));
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
constexpr DrafterEntry DRAFTER_TABLE[] = {
    {"mtp", "draft-mtp", DrafterNeeds::MTP, make_mtp,                     // the model's MTP head (DRAFTER_MTP)
     MtpDrafter::draft_together, MtpDrafter::catch_up_together},
    {"ngram", "ngram-simple", DrafterNeeds::NOTHING, make_ngram_simple},     // llama.cpp's ngram-simple prompt look-up
    {"ngram-mod", "ngram-mod", DrafterNeeds::NOTHING, make_ngram_mod},    // llama.cpp's ngram-mod hashed n-gram table
    {"ngram-map-k", "ngram-map-k", DrafterNeeds::NOTHING, make_ngram_map_k},      // llama.cpp's ngram-map-k key map
    {"ngram-map-k4v", "ngram-map-k4v", DrafterNeeds::NOTHING, make_ngram_map_k4v},  // llama.cpp's ngram-map-k4v key/value map
    {"ngram-cache", "ngram-cache", DrafterNeeds::NOTHING, make_ngram_cache},      // llama.cpp's ngram-cache n-gram statistics
    {"draft-simple", "draft-simple", DrafterNeeds::DRAFT_MODEL, make_draft_simple},  // llama.cpp's draft-simple: a draft model
    {"draft-eagle3", "draft-eagle3", DrafterNeeds::EAGLE3_HEAD, make_draft_eagle3},  // llama.cpp's draft-eagle3: an EAGLE-3 head
    {"draft-dflash", "draft-dflash", DrafterNeeds::DFLASH_HEAD, make_draft_dflash},  // llama.cpp's draft-dflash: a block drafter
    {"draft-dspark", "draft-dspark", DrafterNeeds::DSPARK_HEAD, make_draft_dflash},  // llama.cpp's draft-dspark: DFlash + Markov head
};
static_assert(DRAFTER_TABLE[DRAFTER_MTP].make == make_mtp, "the MTP drafter is DRAFTER_MTP");
const int32_t N_DRAFTERS = (int32_t) (sizeof(DRAFTER_TABLE) / sizeof(DRAFTER_TABLE[0]));

const char * drafter_name(int32_t id) { return DRAFTER_TABLE[id].name; }
const char * drafter_spec_type(int32_t id) { return DRAFTER_TABLE[id].spec_type; }

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
