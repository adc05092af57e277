#include "nextn_api.h"

#include <dlfcn.h>

#include <type_traits>

std::string linked_libllama_path() {
    Dl_info info{};
    if (dladdr(reinterpret_cast<void *>(&llama_backend_init), &info) == 0 || info.dli_fname == nullptr) {
        return {};
    }
    return info.dli_fname;
}

std::vector<std::string> NextnApi::load(const std::string & lib_path) {
    std::vector<std::string> missing;
    const std::string path = lib_path.empty() ? linked_libllama_path() : lib_path;
    void * handle = dlopen(path.c_str(), RTLD_LAZY | RTLD_LOCAL);
    if (handle == nullptr) {
        missing.push_back("<library " + path + " cannot be opened>");
        return missing;
    }
    auto resolve = [&](auto & fn, const char * symbol, const char * name) {
        fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(handle, symbol));
        if (fn == nullptr) {
            missing.emplace_back(name);
        }
    };
    // llama-ext.h declares its staging functions with C++ linkage: look them up by mangled name
    resolve(set_embeddings_nextn, "_Z26llama_set_embeddings_nextnP13llama_contextbb", "llama_set_embeddings_nextn");
    resolve(get_embeddings_nextn_ith, "_Z30llama_get_embeddings_nextn_ithP13llama_contexti",
            "llama_get_embeddings_nextn_ith");
    resolve(model_n_layer_nextn, "llama_model_n_layer_nextn", "llama_model_n_layer_nextn");
    resolve(n_rs_seq, "llama_n_rs_seq", "llama_n_rs_seq");
    resolve(set_embeddings_layer_inp, "_Z30llama_set_embeddings_layer_inpP13llama_contextjb",
            "llama_set_embeddings_layer_inp");
    resolve(get_embeddings_layer_inp, "_Z30llama_get_embeddings_layer_inpP13llama_contextj",
            "llama_get_embeddings_layer_inp");
    resolve(get_embeddings_nextn, "_Z26llama_get_embeddings_nextnP13llama_context", "llama_get_embeddings_nextn");
    resolve(model_target_layer_ids, "_Z28llama_model_target_layer_idsPK11llama_model",
            "llama_model_target_layer_ids");
    resolve(model_target_layer_ids_n, "_Z30llama_model_target_layer_ids_nPK11llama_model",
            "llama_model_target_layer_ids_n");
    resolve(set_nextn_layer_offset, "_Z28llama_set_nextn_layer_offsetP13llama_contexti",
            "llama_set_nextn_layer_offset");
    resolve(get_ctx_other, "_Z19llama_get_ctx_otherP13llama_context", "llama_get_ctx_other");
    // the handle stays open: the functions are used for the life of the process
    return missing;
}
