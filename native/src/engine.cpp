// Engine lifetime: error reporting, model loading and validation, the
// vocabulary compatibility check, tokenizer and metadata access.
#include "engine.h"

#include "ggml-backend.h"
#include "ggml.h"
#include "gguf.h"
#include "rpc.h"
#include "text_bridge.h"
#include "weight_repacking.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <deque>
#include <mutex>
#include <sstream>
#include <sys/stat.h>
#include <thread>
#include <vector>

// ---------------------------------------------------------------- errors and logs

namespace {

thread_local std::string g_last_error;
// The last few error lines llama.cpp logged on this thread: appended to our
// messages so a failed load says why (llama.cpp only logs the reason).
thread_local std::deque<std::string> g_llama_errors;
bool g_llama_log_enabled = false;

void llama_log_hook(ggml_log_level level, const char * text, void * /*user_data*/) {
    if (g_llama_log_enabled) {
        std::fputs(text, stderr);
    }
    if (level == GGML_LOG_LEVEL_ERROR) {
        std::string line(text);
        while (!line.empty() && (line.back() == '\n' || line.back() == ' ')) {
            line.pop_back();
        }
        g_llama_errors.push_back(line);
        if (g_llama_errors.size() > 4) {
            g_llama_errors.pop_front();
        }
    }
}

std::once_flag g_backend_once;

void init_backend() {
    std::call_once(g_backend_once, [] {
        llama_log_set(llama_log_hook, nullptr);
        llama_backend_init();
    });
}

} // namespace

namespace cospec {

std::string take_llama_errors() {
    std::string out;
    for (const auto & line : g_llama_errors) {
        out += (out.empty() ? "" : "; ") + line;
    }
    g_llama_errors.clear();
    return out;
}

// Messages quote file contents: keep them valid UTF-8 (invalid bytes become '?')
// and bounded, whatever a file holds.
constexpr size_t MAX_MESSAGE_BYTES = 1000;

static std::string printable(const std::string & s) {
    std::string out;
    out.reserve(std::min(s.size(), MAX_MESSAGE_BYTES));
    for (size_t i = 0; i < s.size() && out.size() < MAX_MESSAGE_BYTES;) {
        const unsigned char c = (unsigned char) s[i];
        size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        bool ok = n > 0 && i + n <= s.size();
        for (size_t k = 1; ok && k < n; ++k) {
            ok = ((unsigned char) s[i + k] >> 6) == 2;
        }
        if (ok && c >= 0x20) {
            out.append(s, i, n);
            i += n;
        } else {
            out += (c == '\n' || c == '\t') ? ' ' : '?';
            i += ok ? n : 1;
        }
    }
    if (out.size() < s.size() && out.size() >= MAX_MESSAGE_BYTES) {
        out += " [... " + std::to_string(s.size() - out.size()) + " more bytes]";
    }
    return out;
}

int32_t fail(int32_t status, const std::string & message) {
    g_last_error = printable(message);
    return status;
}

void clear_error() {
    g_last_error.clear();
    g_llama_errors.clear();
}

// ---------------------------------------------------------------- model files

// Validate a GGUF file before llama.cpp sees it: the file must exist, parse as
// GGUF, and every tensor's data must lie inside the file. llama.cpp checks much
// of this too, but a clear message here beats a log line, and model files are
// untrusted input.
int32_t check_gguf_file(const char * role, const char * path) {
    const std::string who = std::string(role) + " '" + path + "'";
    struct stat st {};
    if (stat(path, &st) != 0) {
        return fail(COSPEC_ERR_MODEL_LOAD, who + ": file not found");
    }
    if (!S_ISREG(st.st_mode)) {
        return fail(COSPEC_ERR_MODEL_LOAD, who + ": not a regular file");
    }
    FILE * f = std::fopen(path, "rb");
    if (f == nullptr) {
        return fail(COSPEC_ERR_MODEL_LOAD, who + ": cannot be opened for reading");
    }
    char magic[4] = {0, 0, 0, 0};
    const size_t got = std::fread(magic, 1, 4, f);
    std::fclose(f);
    if (got != 4 || std::memcmp(magic, "GGUF", 4) != 0) {
        return fail(COSPEC_ERR_MODEL_LOAD, who + ": not a GGUF file (bad magic)");
    }
    gguf_init_params gp {};
    gp.no_alloc = true;
    gp.ctx = nullptr;
    gguf_context * g = gguf_init_from_file(path, gp);
    if (g == nullptr) {
        std::string why = take_llama_errors();
        return fail(COSPEC_ERR_MODEL_LOAD, who + ": corrupt or truncated GGUF header" + (why.empty() ? "" : " (" + why + ")"));
    }
    const uint64_t file_size = (uint64_t) st.st_size;
    const uint64_t data_offset = gguf_get_data_offset(g);
    int32_t status = COSPEC_OK;
    const int64_t n_tensors = gguf_get_n_tensors(g);
    if (n_tensors == 0) {
        status = fail(COSPEC_ERR_MODEL_LOAD, who + ": holds no tensors (is it an adapter or a vocabulary-only file?)");
    }
    for (int64_t i = 0; i < n_tensors && status == COSPEC_OK; ++i) {
        const uint64_t off = gguf_get_tensor_offset(g, i);
        const uint64_t size = gguf_get_tensor_size(g, i);
        if (data_offset > file_size || off > file_size - data_offset || size > file_size - data_offset - off) {
            status = fail(COSPEC_ERR_MODEL_LOAD, who + ": truncated (tensor '" + gguf_get_tensor_name(g, i) +
                                                     "' lies past the end of the file)");
        }
    }
    gguf_free(g);
    return status;
}


// 64-bit fingerprint of a model's tensors: names, types, shapes and data.
// splitmix64's finaliser over 8-byte words: fast enough to run on every
// arbiter load (tens of MB in milliseconds) and stable across platforms.
namespace {
uint64_t mix64(uint64_t x) {
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    x ^= x >> 31;
    return x;
}

struct hasher {
    uint64_t h = 0x636f73706563ULL; // "cospec"
    void word(uint64_t w) { h = mix64(h ^ w) + 0x9e3779b97f4a7c15ULL; }
    void bytes(const unsigned char * p, size_t n) {
        size_t i = 0;
        for (; i + 8 <= n; i += 8) {
            uint64_t w;
            std::memcpy(&w, p + i, 8);
            word(w);
        }
        uint64_t tail = n - i; // the length separates "ab" + "" from "a" + "b"
        for (size_t k = 0; i < n; ++i, ++k) {
            tail ^= (uint64_t) p[i] << (8 * (k + 1));
        }
        word(tail);
    }
    void text(const std::string & s) { bytes((const unsigned char *) s.data(), s.size()); }
};
} // namespace

namespace {
std::string hex_of(uint64_t h) {
    char hex[17];
    std::snprintf(hex, sizeof(hex), "%016llx", (unsigned long long) h);
    return hex;
}

// One tensor's part of a fingerprint: name, type, shape (where known) and data, in that order.
void hash_tensor(hasher & h, const char * name, ggml_type type, const ggml_tensor * shape, const void * data, size_t size) {
    h.text(name);
    h.word((uint64_t) type);
    if (shape != nullptr) {
        for (int d = 0; d < GGML_MAX_DIMS; ++d) {
            h.word((uint64_t) shape->ne[d]);
        }
    }
    h.bytes((const unsigned char *) data, size);
}

// Of the metadata as gguf serialises it: every key and value, and the tensor infos.
std::string header_hash(const gguf_context * g) {
    std::vector<unsigned char> meta(gguf_get_meta_size(g));
    gguf_get_meta_data(g, meta.data());
    hasher h;
    h.bytes(meta.data(), meta.size());
    return hex_of(h.h);
}
} // namespace

bool loaded_model_fingerprint(const gguf_context * g, const ggml_context * data, std::string & out, std::string * header) {
    hasher h;
    for (int64_t i = 0; i < gguf_get_n_tensors(g); ++i) {
        const char * name = gguf_get_tensor_name(g, i);
        const ggml_tensor * t = ggml_get_tensor(const_cast<ggml_context *>(data), name);
        if (t == nullptr || t->data == nullptr || ggml_nbytes(t) != gguf_get_tensor_size(g, i)) {
            return false;
        }
        hash_tensor(h, name, gguf_get_tensor_type(g, i), t, t->data, ggml_nbytes(t));
    }
    out = hex_of(h.h);
    if (header != nullptr) {
        *header = header_hash(g);
    }
    return true;
}

int32_t model_fingerprint(const char * path, std::string & out, std::string * header) {
    if (path == nullptr) {
        return fail(COSPEC_ERR_INVALID_ARGUMENT, "fingerprint: no path");
    }
    if (const int32_t st = check_gguf_file("model", path); st != COSPEC_OK) {
        return st;
    }
    ggml_context * meta = nullptr;
    gguf_init_params gp {};
    gp.no_alloc = true;
    gp.ctx = &meta;
    gguf_context * g = gguf_init_from_file(path, gp);
    if (g == nullptr) {
        return fail(COSPEC_ERR_MODEL_LOAD, std::string("model '") + path + "': corrupt GGUF header");
    }
    FILE * f = std::fopen(path, "rb");
    if (f == nullptr) {
        gguf_free(g);
        ggml_free(meta);
        return fail(COSPEC_ERR_MODEL_LOAD, std::string("model '") + path + "' cannot be opened for reading");
    }
    hasher h;
    std::vector<unsigned char> buf;
    int32_t status = COSPEC_OK;
    const size_t data_offset = gguf_get_data_offset(g);
    for (int64_t i = 0; i < gguf_get_n_tensors(g) && status == COSPEC_OK; ++i) {
        const char * name = gguf_get_tensor_name(g, i);
        const size_t size = gguf_get_tensor_size(g, i);
        buf.resize(size);
        if (std::fseek(f, (long) (data_offset + gguf_get_tensor_offset(g, i)), SEEK_SET) != 0 ||
            std::fread(buf.data(), 1, size, f) != size) {
            status = fail(COSPEC_ERR_MODEL_LOAD, std::string("model '") + path + "': tensor data cannot be read");
            break;
        }
        hash_tensor(h, name, gguf_get_tensor_type(g, i), meta ? ggml_get_tensor(meta, name) : nullptr, buf.data(), size);
    }
    std::fclose(f);
    if (status == COSPEC_OK) {
        out = hex_of(h.h);
        if (header != nullptr) {
            *header = header_hash(g);
        }
    }
    gguf_free(g);
    ggml_free(meta);
    return status;
}

struct progress_bridge {
    cospec_progress_fn fn;
    void * user_data;
    int32_t which;
    bool cancelled;
};

static bool on_load_progress(float progress, void * data) {
    auto * b = static_cast<progress_bridge *>(data);
    const bool go_on = b->fn(b->which, progress, b->user_data);
    b->cancelled = !go_on;
    return go_on;
}

// What a GGUF's header says of head drafters: its architecture ("eagle3": an EAGLE-3 head) and
// the multi-token-prediction layers it carries ({arch}.nextn_predict_layers). A header that
// cannot be read says nothing here (loading the file reports what is wrong with it).
struct head_info {
    std::string arch;
    uint32_t n_nextn = 0;
    // An EAGLE-3 head's: the width of the target hidden states it reads, and whether it has token
    // embeddings of its own (else it takes the target's, which must then be as wide as its own).
    int64_t target_hidden = -1;
    bool own_token_embd = false;
    // Its draft-to-target vocabulary map (d2t), which llama.cpp's graph scatters the logits by
    // unchecked: "" where it is absent or sound, else what is wrong with it.
    std::string d2t_problem;
    bool dspark = false; // a DFlash file that is DSpark's (which llama.cpp drafts another way)
};

// d2t: I64, one entry per row of the head's output matrix, each a distinct target token id.
static std::string check_d2t(const char * path, gguf_context * g, ggml_context * meta, int64_t n_vocab) {
    const int64_t id = gguf_find_tensor(g, "d2t");
    if (id < 0) {
        return "";
    }
    const ggml_tensor * d2t = ggml_get_tensor(meta, "d2t");
    const ggml_tensor * out = ggml_get_tensor(meta, "output.weight");
    if (d2t == nullptr || d2t->type != GGML_TYPE_I64 || ggml_n_dims(d2t) != 1) {
        return "its d2t map is not one row of 64-bit integers";
    }
    if (out == nullptr || out->ne[1] != d2t->ne[0]) {
        return "its d2t map has " + std::to_string(d2t->ne[0]) + " entries, its output head another count of rows";
    }
    if (n_vocab <= 0 || d2t->ne[0] > n_vocab) {
        return "its d2t map is longer than its vocabulary";
    }
    std::vector<int64_t> ids((size_t) d2t->ne[0]);
    FILE * f = std::fopen(path, "rb");
    bool read = f != nullptr && std::fseek(f, (long) (gguf_get_data_offset(g) + gguf_get_tensor_offset(g, id)), SEEK_SET) == 0 &&
                std::fread(ids.data(), sizeof(int64_t), ids.size(), f) == ids.size();
    if (f != nullptr) {
        std::fclose(f);
    }
    if (!read) {
        return "its d2t map cannot be read";
    }
    std::vector<bool> used((size_t) n_vocab, false);
    for (const int64_t t : ids) {
        if (t < 0 || t >= n_vocab || used[(size_t) t]) {
            return "its d2t map names token " + std::to_string(t) + " out of range or twice";
        }
        used[(size_t) t] = true;
    }
    return "";
}

// The architectures a head drafter file has (llama.cpp's eagle3 and dflash models).
static bool is_head_drafter(const std::string & arch) {
    return arch == "eagle3" || arch == "dflash";
}

static head_info read_head_info(const char * path) {
    head_info info;
    if (check_gguf_file("model", path) != COSPEC_OK) {
        cospec::clear_error(); // loading it says what is wrong
        return info;
    }
    ggml_context * meta = nullptr;
    gguf_init_params gp {};
    gp.no_alloc = true;
    gp.ctx = &meta;
    gguf_context * g = gguf_init_from_file(path, gp);
    if (g == nullptr) {
        return info;
    }
    const int64_t key = gguf_find_key(g, "general.architecture");
    if (key >= 0 && gguf_get_kv_type(g, key) == GGUF_TYPE_STRING) {
        info.arch = gguf_get_val_str(g, key);
        const int64_t nextn = gguf_find_key(g, (info.arch + ".nextn_predict_layers").c_str());
        if (nextn >= 0 && gguf_get_kv_type(g, nextn) == GGUF_TYPE_UINT32) {
            info.n_nextn = gguf_get_val_u32(g, nextn);
        }
        const int64_t hidden = gguf_find_key(g, (info.arch + ".target_hidden_size").c_str());
        if (hidden >= 0 && gguf_get_kv_type(g, hidden) == GGUF_TYPE_UINT32) {
            info.target_hidden = gguf_get_val_u32(g, hidden);
        }
        info.own_token_embd = gguf_find_tensor(g, "token_embd.weight") >= 0;
        // DSpark: DFlash with a Markov head, or on DeepSeek-V4's blocks (llama.cpp's draft-dspark).
        info.dspark = info.arch == "dflash" && (gguf_find_tensor(g, "markov_w1.weight") >= 0 ||
                                                gguf_find_key(g, "dflash.hyper_connection.count") >= 0);
        if (info.arch == "eagle3" || info.arch == "dflash") {
            const int64_t vocab = gguf_find_key(g, "tokenizer.ggml.tokens");
            const int64_t n_vocab = vocab >= 0 && gguf_get_kv_type(g, vocab) == GGUF_TYPE_ARRAY ? (int64_t) gguf_get_arr_n(g, vocab) : 0;
            info.d2t_problem = check_d2t(path, g, meta, n_vocab);
        }
    }
    gguf_free(g);
    ggml_free(meta);
    return info;
}

// llama.cpp's KV cache types (common/arg.cpp's kv_cache_types), by their -ctk names.
static const ggml_type CACHE_TYPES[] = {GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_BF16, GGML_TYPE_Q8_0, GGML_TYPE_Q4_0,
                                        GGML_TYPE_Q4_1, GGML_TYPE_IQ4_NL, GGML_TYPE_Q5_0, GGML_TYPE_Q5_1};

// A cache type by name (NULL or "": f16, llama.cpp's default); false for a name it does not take.
static bool cache_type(const char * name, ggml_type & out) {
    if (name == nullptr || name[0] == '\0') {
        out = GGML_TYPE_F16;
        return true;
    }
    for (const ggml_type t : CACHE_TYPES) {
        if (std::strcmp(ggml_type_name(t), name) == 0) {
            out = t;
            return true;
        }
    }
    return false;
}

static std::string cache_type_names() {
    std::string names;
    for (const ggml_type t : CACHE_TYPES) {
        names += (names.empty() ? "" : ", ") + std::string(ggml_type_name(t));
    }
    return names;
}

// llama.cpp's load mode by its -lm name (NULL or "": auto); false for a name it does not have.
static bool load_mode(const char * name, llama_load_mode & out) {
    out = LLAMA_LOAD_MODE_AUTO;
    if (name == nullptr || name[0] == '\0') {
        return true;
    }
    for (int mode = LLAMA_LOAD_MODE_AUTO; mode <= LLAMA_LOAD_MODE_DIRECT_IO; ++mode) {
        if (std::strcmp(llama_load_mode_name((llama_load_mode) mode), name) == 0) {
            out = (llama_load_mode) mode;
            return true;
        }
    }
    return false;
}

// Devices named as llama.cpp's -dev takes them ("none": the CPU alone), null-terminated as
// llama_model_params.devices wants; empty for NULL or "" (llama.cpp's choice).
static int32_t parse_devices(const char * setting, const char * flag, std::vector<ggml_backend_dev_t> & out) {
    out.clear();
    if (setting == nullptr || setting[0] == '\0') {
        return COSPEC_OK;
    }
    std::stringstream names(setting);
    for (std::string name; std::getline(names, name, ',');) {
        if (name == "none" && std::string(setting) == "none") {
            break;
        }
        ggml_backend_dev_t dev = ggml_backend_dev_by_name(name.c_str());
        if (dev == nullptr || ggml_backend_dev_type(dev) == GGML_BACKEND_DEVICE_TYPE_CPU) {
            const std::string have = cospec_device_names();
            return fail(COSPEC_ERR_INVALID_ARGUMENT, std::string(flag) + ": no device '" + name + "' to offload to (" +
                                                         (have.empty() ? "this llama.cpp build has none; 'none' runs "
                                                                         "on the CPU" : "this build has " + have + ", or none") + ")");
        }
        out.push_back(dev);
    }
    out.push_back(nullptr);
    return COSPEC_OK;
}

// The settings above for each model, checked and resolved once (a clear error names the field).
static int32_t resolve_llama_settings(const cospec_engine_params & p, cospec_engine & e) {
    if (!load_mode(p.load_mode, e.load_mode)) {
        return fail(COSPEC_ERR_INVALID_ARGUMENT, std::string("load_mode: '") + p.load_mode +
                                                     "' is not one of auto, none, mmap, mlock, mmap+mlock, dio");
    }
    const struct { const char * field; const char * value; ggml_type & out; } caches[] = {
        {"cache_type_k", p.cache_type_k, e.cache_type_k[0]}, {"cache_type_v", p.cache_type_v, e.cache_type_v[0]},
        {"cache_type_k_draft", p.cache_type_k_draft, e.cache_type_k[1]},
        {"cache_type_v_draft", p.cache_type_v_draft, e.cache_type_v[1]}};
    for (const auto & [field, value, out] : caches) {
        if (!cache_type(value, out)) {
            return fail(COSPEC_ERR_INVALID_ARGUMENT, std::string(field) + ": '" + value + "' is not a cache type (" +
                                                         cache_type_names() + ")");
        }
    }
    if (const int32_t st = parse_devices(p.devices, "devices", e.devices[0]); st != COSPEC_OK) {
        return st;
    }
    return parse_devices(p.devices_draft, "devices_draft", e.devices[1]);
}

// which: 0 the target, 1 the draft model; head_path: a head drafter instead, on the draft's devices.
static int32_t load_model(const cospec_engine_params & p, cospec_engine & e, int32_t which, model_slot & slot,
                          bool load_mtp = false, const char * head_path = nullptr) {
    const char * path = head_path != nullptr ? head_path : which == 0 ? p.target_path : p.draft_path;
    const char * role = head_path != nullptr ? "head drafter" : which == 0 ? "target" : "draft";
    const std::string what = head_path != nullptr ? std::string(role) : std::string(role) + " model";
    if (const int32_t st = check_gguf_file(what.c_str(), path); st != COSPEC_OK) {
        return st;
    }
    if (const int32_t st = check_model_metadata(what.c_str(), path); st != COSPEC_OK) {
        return st;
    }
    llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = which == 0 ? p.n_gpu_layers_target : p.n_gpu_layers_draft;
    // llama.cpp's weight repacking, on by default as in llama.cpp (AMX only where it runs).
    if (p.use_extra_buffers) {
        cospec::prepare_weight_repacking();
    }
    mp.use_extra_bufts = p.use_extra_buffers;
    mp.load_mtp = load_mtp; // the target's multi-token-prediction layers, for its head drafter
    mp.load_mode = e.load_mode;
    progress_bridge bridge {p.progress_callback, p.progress_user_data, which, false};
    if (p.progress_callback != nullptr) {
        mp.progress_callback = on_load_progress;
        mp.progress_callback_user_data = &bridge;
    }
    const std::vector<ggml_backend_dev_t> & chosen = e.devices[which];
    if (!chosen.empty()) {
        mp.devices = const_cast<ggml_backend_dev_t *>(chosen.data());
    }
    std::vector<ggml_backend_dev_t> devices;
    if (which == 0 && p.rpc_servers != nullptr && p.rpc_servers[0] != '\0') {
        if (const int32_t st = rpc_devices(p.rpc_servers, devices, e.rpc); st != COSPEC_OK) {
            return st;
        }
        // The servers first (llama.cpp's order, least traffic), then this machine's GPUs (those
        // -dev names, if it names any); the CPU is implicit.
        if (!chosen.empty()) {
            devices.insert(devices.end(), chosen.begin(), chosen.end() - 1);
        } else {
            for (size_t i = 0; i < ggml_backend_dev_count(); ++i) {
                ggml_backend_dev_t dev = ggml_backend_dev_get(i);
                if (ggml_backend_dev_type(dev) == GGML_BACKEND_DEVICE_TYPE_GPU) {
                    devices.push_back(dev);
                }
            }
        }
        devices.push_back(nullptr);
        mp.devices = devices.data();
    }
    slot.model = llama_model_load_from_file(path, mp);
    if (slot.model == nullptr) {
        std::string why = take_llama_errors();
        if (bridge.cancelled) {
            return fail(COSPEC_ERR_CANCELLED, std::string(role) + " model loading was cancelled");
        }
        return fail(COSPEC_ERR_MODEL_LOAD, std::string(role) + " model '" + path + "' could not be loaded" +
                                               (why.empty() ? "" : ": " + why));
    }
    slot.vocab = llama_model_get_vocab(slot.model);
    slot.n_vocab = llama_vocab_n_tokens(slot.vocab);
    if (slot.n_vocab <= 0) {
        return fail(COSPEC_ERR_MODEL_LOAD, std::string(role) + " model '" + path + "' has an empty vocabulary");
    }
    if (const char * tmpl = llama_model_chat_template(slot.model, nullptr)) {
        slot.chat_template = tmpl;
        slot.has_chat_template = true;
    }
    char desc[256];
    llama_model_desc(slot.model, desc, sizeof(desc));
    slot.desc = desc;
    return COSPEC_OK;
}

static_assert(COSPEC_FLASH_ATTN_AUTO == LLAMA_FLASH_ATTN_TYPE_AUTO && COSPEC_FLASH_ATTN_OFF == LLAMA_FLASH_ATTN_TYPE_DISABLED &&
                  COSPEC_FLASH_ATTN_ON == LLAMA_FLASH_ATTN_TYPE_ENABLED,
              "cospec_engine_flash_attn returns llama.cpp's values as the C enum's");

// llama.cpp's flash-attention setting for a context whose model has `gpu_layers`
// offloaded (-1: all). Layers on RPC servers count as on the CPU: what the
// servers run is not known here, and -fa says otherwise.
static llama_flash_attn_type flash_attn_type(int32_t setting, int32_t gpu_layers, const llama_model * model) {
    switch (setting) {
        case COSPEC_FLASH_ATTN_OFF: return LLAMA_FLASH_ATTN_TYPE_DISABLED;
        case COSPEC_FLASH_ATTN_ON:  return LLAMA_FLASH_ATTN_TYPE_ENABLED;
        case COSPEC_FLASH_ATTN_AUTO: return LLAMA_FLASH_ATTN_TYPE_AUTO;
        default: {
            const bool offloaded = cospec_supports_gpu_offload() && gpu_layers != 0;
            const bool small = llama_model_n_params(model) < COSPEC_FLASH_ATTN_CPU_OFF_MAX_PARAMS;
            return offloaded || !small ? LLAMA_FLASH_ATTN_TYPE_AUTO : LLAMA_FLASH_ATTN_TYPE_DISABLED;
        }
    }
}

static llama_context_params context_params(const cospec_engine_params & p, cospec_engine & e, llama_flash_attn_type flash_attn,
                                           bool draft = false) {
    llama_context_params cp = llama_context_default_params();
    cp.flash_attn_type = flash_attn;
    cp.n_ctx = (uint32_t) e.n_ctx;
    cp.n_batch = (uint32_t) e.n_batch;
    cp.n_ubatch = (uint32_t) e.n_ubatch;
    cp.type_k = e.cache_type_k[draft ? 1 : 0];
    cp.type_v = e.cache_type_v[draft ? 1 : 0];
    cp.n_seq_max = 1;
    const int32_t hw = (int32_t) std::max(1u, std::thread::hardware_concurrency());
    cp.n_threads = p.n_threads > 0 ? p.n_threads : hw;
    cp.n_threads_batch = p.n_threads_batch > 0 ? p.n_threads_batch : cp.n_threads;
    e.n_threads = cp.n_threads;
    e.n_threads_batch = cp.n_threads_batch;
    cp.no_perf = true;
    cp.swa_full = true; // sliding-window models (Gemma 3) need the full cache to roll back rejected tokens
    cp.abort_callback = [](void * data) { return static_cast<std::atomic<bool> *>(data)->load(); };
    cp.abort_callback_data = &e.abort_flag;
    return cp;
}

static int32_t create_context(const cospec_engine_params & p, cospec_engine & e, model_slot & slot, const char * role,
                              llama_flash_attn_type flash_attn) {
    const llama_context_params cp = context_params(p, e, flash_attn, &slot == &e.draft);
    slot.flash_attn = flash_attn;
    slot.ctx = llama_init_from_model(slot.model, cp);
    if (slot.ctx == nullptr) {
        std::string why = take_llama_errors();
        return fail(COSPEC_ERR_MODEL_LOAD, std::string("could not create the ") + role + " context" +
                                               (why.empty() ? "" : ": " + why));
    }
    slot.batch = llama_batch_init(e.n_batch, 0, 1);
    slot.cached.clear();
    slot.tail_fixed = llama_model_is_recurrent(slot.model) || llama_model_is_hybrid(slot.model);
    return COSPEC_OK;
}

static const char * vocab_type_name(enum llama_vocab_type t) {
    switch (t) {
        case LLAMA_VOCAB_TYPE_NONE: return "none";
        case LLAMA_VOCAB_TYPE_SPM:  return "SentencePiece (spm)";
        case LLAMA_VOCAB_TYPE_BPE:  return "byte-level BPE (bpe)";
        case LLAMA_VOCAB_TYPE_WPM:  return "WordPiece (wpm)";
        case LLAMA_VOCAB_TYPE_UGM:  return "Unigram (ugm)";
        case LLAMA_VOCAB_TYPE_RWKV: return "RWKV";
        default:                    return "other";
    }
}

// Mirrors the spirit of llama.cpp's own draft/target check: the draft's tokens
// must mean the same bytes as the target's, or verification compares nonsense.
// How the draft's vocabulary differs from the target's; empty where they are the same, so that
// the draft's token ids are the target's.
static std::string vocab_difference(const model_slot & tgt, const model_slot & dft) {
    using std::to_string;
    const llama_vocab * vt = tgt.vocab;
    const llama_vocab * vd = dft.vocab;
    if (llama_vocab_type(vt) != llama_vocab_type(vd)) {
        return std::string("tokenizer type differs (target ") + vocab_type_name(llama_vocab_type(vt)) + ", draft " +
               vocab_type_name(llama_vocab_type(vd)) + ")";
    }
    if (llama_vocab_get_add_bos(vt) != llama_vocab_get_add_bos(vd) ||
        (llama_vocab_get_add_bos(vt) && llama_vocab_bos(vt) != llama_vocab_bos(vd))) {
        return "BOS differs (target add_bos=" + to_string(llama_vocab_get_add_bos(vt)) + " id=" + to_string(llama_vocab_bos(vt)) +
               ", draft add_bos=" + to_string(llama_vocab_get_add_bos(vd)) + " id=" + to_string(llama_vocab_bos(vd)) + ")";
    }
    if (llama_vocab_eos(vt) != llama_vocab_eos(vd)) {
        return "EOS differs (target id=" + to_string(llama_vocab_eos(vt)) + ", draft id=" + to_string(llama_vocab_eos(vd)) + ")";
    }
    if (llama_vocab_get_add_eos(vt) != llama_vocab_get_add_eos(vd)) {
        return "one tokenizer appends EOS to every text and the other does not (target add_eos=" +
               to_string(llama_vocab_get_add_eos(vt)) + ", draft add_eos=" + to_string(llama_vocab_get_add_eos(vd)) + ")";
    }
    const int32_t diff = std::abs(tgt.n_vocab - dft.n_vocab);
    if (diff > MAX_VOCAB_SIZE_DIFFERENCE) {
        return "sizes differ by " + to_string(diff) + " tokens (target " + to_string(tgt.n_vocab) + ", draft " +
               to_string(dft.n_vocab) + ", at most " + to_string(MAX_VOCAB_SIZE_DIFFERENCE) + " for one vocabulary)";
    }
    const int32_t n = std::min(tgt.n_vocab, dft.n_vocab);
    int32_t n_differ = 0;
    int32_t first = -1;
    for (int32_t i = 0; i < n; ++i) {
        if (std::strcmp(llama_vocab_get_text(vt, i), llama_vocab_get_text(vd, i)) != 0) {
            n_differ += 1;
            first = first < 0 ? i : first;
        }
    }
    if (n_differ > 0) {
        return to_string(n_differ) + " token texts differ, first at id " + to_string(first) + " (target '" +
               llama_vocab_get_text(vt, first) + "', draft '" + llama_vocab_get_text(vd, first) + "')";
    }
    return "";
}

} // namespace cospec

// ---------------------------------------------------------------- engine object

model_slot::~model_slot() {
    if (ctx != nullptr) {
        llama_batch_free(batch);
        llama_free(ctx);
    }
    if (model != nullptr) {
        llama_model_free(model);
    }
}

using namespace cospec;

extern "C" {

const char * cospec_last_error(void) {
    return g_last_error.c_str();
}

const char * cospec_status_name(int32_t status) {
    switch (status) {
        case COSPEC_OK:                   return "ok";
        case COSPEC_ERR_INVALID_ARGUMENT: return "invalid_argument";
        case COSPEC_ERR_MODEL_LOAD:       return "model_load";
        case COSPEC_ERR_VOCAB_MISMATCH:   return "vocab_mismatch";
        case COSPEC_ERR_CONTEXT_FULL:     return "context_full";
        case COSPEC_ERR_DECODE:           return "decode";
        case COSPEC_ERR_ARBITER:          return "arbiter";
        case COSPEC_ERR_NO_DRAFT:         return "no_draft";
        case COSPEC_ERR_CANCELLED:        return "cancelled";
        case COSPEC_ERR_ADAPTER:          return "adapter";
        case COSPEC_ERR_ARBITER_DRAFT:    return "arbiter_draft";
        case COSPEC_ERR_INTERNAL:         return "internal";
        default:                          return "unknown";
    }
}

int32_t cospec_model_fingerprint(const char * path, char * buf, size_t buf_size) {
    clear_error();
    std::string fp;
    if (const int32_t st = model_fingerprint(path, fp); st != COSPEC_OK) {
        return st;
    }
    if (buf != nullptr && buf_size > 0) {
        std::snprintf(buf, buf_size, "%s", fp.c_str());
    }
    return (int32_t) fp.size();
}

const char * cospec_version(void) {
    return "cospec 0.1.0 (llama.cpp via llama-cpp-python 0.3.36)";
}

const char * cospec_system_info(void) {
    init_backend();
    return llama_print_system_info();
}

void cospec_set_llama_log(bool enabled) {
    init_backend();
    g_llama_log_enabled = enabled;
}

bool cospec_supports_gpu_offload(void) {
    init_backend();
    // Not llama_supports_gpu_offload(): that also says yes for a CPU build with
    // the RPC backend, which this project always builds.
    return ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_GPU) != nullptr ||
           ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_IGPU) != nullptr;
}

const char * cospec_device_names(void) {
    init_backend();
    static std::string names; // the devices do not change once the backends are loaded
    static std::once_flag once;
    std::call_once(once, [] {
        for (size_t i = 0; i < ggml_backend_dev_count(); ++i) {
            ggml_backend_dev_t dev = ggml_backend_dev_get(i);
            if (ggml_backend_dev_type(dev) != GGML_BACKEND_DEVICE_TYPE_CPU) { // as llama.cpp's --list-devices
                names += (names.empty() ? "" : ", ") + std::string(ggml_backend_dev_name(dev));
            }
        }
    });
    return names.c_str();
}

cospec_engine_params cospec_engine_default_params(void) {
    cospec_engine_params p {};
    p.target_path = nullptr;
    p.draft_path = nullptr;
    p.n_ctx = COSPEC_DEFAULT_N_CTX;
    p.n_batch = 512;
    p.n_threads = 0;
    p.rpc_servers = nullptr;
    p.n_threads_batch = 0;
    p.n_gpu_layers_target = -1;
    p.n_gpu_layers_draft = -1;
    p.n_ubatch = 0;
    p.use_extra_buffers = true;
    p.flash_attn = COSPEC_FLASH_ATTN_CPU_OFF;
    p.cache_type_k = nullptr;
    p.cache_type_v = nullptr;
    p.cache_type_k_draft = nullptr;
    p.cache_type_v_draft = nullptr;
    p.load_mode = nullptr;
    p.devices = nullptr;
    p.devices_draft = nullptr;
    p.progress_callback = nullptr;
    p.progress_user_data = nullptr;
    p.head_path = nullptr;
    return p;
}

int32_t cospec_engine_open(const cospec_engine_params * params, cospec_engine ** out) {
    clear_error();
    if (out == nullptr || params == nullptr) {
        return fail(COSPEC_ERR_INVALID_ARGUMENT, "cospec_engine_open: params and out must not be NULL");
    }
    *out = nullptr;
    if (params->target_path == nullptr || params->target_path[0] == '\0') {
        return fail(COSPEC_ERR_INVALID_ARGUMENT, "a target model path is required");
    }
    if (params->n_ctx < 0 || params->n_batch < 0 || params->n_ubatch < 0 || params->n_threads < 0 ||
        params->n_threads_batch < 0) {
        return fail(COSPEC_ERR_INVALID_ARGUMENT, "n_ctx, n_batch, n_ubatch and thread counts must not be negative");
    }
    if (params->n_threads > GGML_MAX_N_THREADS || params->n_threads_batch > GGML_MAX_N_THREADS) {
        return fail(COSPEC_ERR_INVALID_ARGUMENT, "thread counts must be at most " + std::to_string(GGML_MAX_N_THREADS) +
                                                     " (ggml's limit)");
    }
    if (params->flash_attn < COSPEC_FLASH_ATTN_CPU_OFF || params->flash_attn > COSPEC_FLASH_ATTN_ON) {
        return fail(COSPEC_ERR_INVALID_ARGUMENT, "flash_attn must be one of COSPEC_FLASH_ATTN_* (-2..1), got " +
                                                     std::to_string(params->flash_attn));
    }
    init_backend();
    try {
        auto e = std::make_unique<cospec_engine>();
        if (const int32_t st = resolve_llama_settings(*params, *e); st != COSPEC_OK) {
            return st;
        }
        const bool draft_given = params->draft_path != nullptr && params->draft_path[0] != '\0';
        const bool head_given = params->head_path != nullptr && params->head_path[0] != '\0';
        // A head drafter given as the draft (an EAGLE-3 head, a DFlash drafter: llama.cpp's -md)
        // drafts from the target's hidden states: no draft model.
        const head_info draft_info = draft_given ? read_head_info(params->draft_path) : head_info {};
        const bool draft_is_head = is_head_drafter(draft_info.arch);
        if (head_given && draft_is_head) {
            return fail(COSPEC_ERR_INVALID_ARGUMENT, "two head drafters were given (as the draft and as the head); "
                                                     "an engine drafts with one");
        }
        const head_info head_file = head_given ? read_head_info(params->head_path) : draft_info;
        if (head_given) {
            if (int32_t st = check_gguf_file("head drafter", params->head_path); st != COSPEC_OK) {
                return st;
            }
            if (!is_head_drafter(head_file.arch)) {
                return fail(COSPEC_ERR_MODEL_LOAD, std::string("'") + params->head_path + "' is not a head drafter (an "
                                                   "EAGLE-3 head or a DFlash drafter; its architecture is " +
                                                   (head_file.arch.empty() ? "unreadable" : head_file.arch) +
                                                   "); a draft model goes in the draft's place");
            }
        }
        const bool eagle3 = head_file.arch == "eagle3";
        const bool dflash = head_file.arch == "dflash";
        // The target's MTP layers load where they will draft: a head file given wins over them.
        const head_info target_heads = read_head_info(params->target_path);
        if (int32_t st = load_model(*params, *e, 0, e->target, target_heads.n_nextn > 0 && !eagle3 && !dflash); st != COSPEC_OK) {
            return st;
        }
        model_slot head_model;
        if (eagle3 || dflash) {
            if (head_file.dspark) {
                return fail(COSPEC_ERR_INVALID_ARGUMENT, "a DSpark drafter (DFlash with a Markov head, llama.cpp's "
                                                         "draft-dspark) is not supported; use a DFlash or EAGLE-3 "
                                                         "head, or a draft model");
            }
            if (!head_file.d2t_problem.empty()) {
                return fail(COSPEC_ERR_MODEL_LOAD, std::string(eagle3 ? "the EAGLE-3 head" : "the DFlash drafter") +
                                                       " cannot be used: " + head_file.d2t_problem);
            }
            if (int32_t st = load_model(*params, *e, 1, head_model, false, head_given ? params->head_path : params->draft_path);
                st != COSPEC_OK) {
                return st;
            }
        }
        if (eagle3) {
            // Widths llama.cpp's graphs assume equal (a mismatch would abort in a matrix product).
            const int64_t n_embd_target = llama_model_n_embd(e->target.model);
            if (head_file.target_hidden != n_embd_target) {
                return fail(COSPEC_ERR_MODEL_LOAD, "the EAGLE-3 head reads target hidden states of width " +
                                                       std::to_string(head_file.target_hidden) + ", the target's are " +
                                                       std::to_string(n_embd_target) + ": a head made for another target");
            }
            if (!head_file.own_token_embd && llama_model_n_embd(head_model.model) != n_embd_target) {
                return fail(COSPEC_ERR_MODEL_LOAD, "the EAGLE-3 head has no token embeddings of its own and is " +
                                                       std::to_string(llama_model_n_embd(head_model.model)) +
                                                       " wide, the target's embeddings " + std::to_string(n_embd_target));
            }
        }
        e->has_draft = draft_given && !draft_is_head;
        if (e->has_draft) {
            if (int32_t st = load_model(*params, *e, 1, e->draft); st != COSPEC_OK) {
                return st;
            }
            e->draft_path = params->draft_path;
            e->draft_gpu_layers = params->n_gpu_layers_draft;
            e->draft_extra_buffers = params->use_extra_buffers;
            e->draft_cost_ratio = (double) llama_model_n_params(e->draft.model) /
                                  (double) std::max<uint64_t>(1, llama_model_n_params(e->target.model));
            e->vocab_difference = vocab_difference(e->target, e->draft);
            std::string why;
            if (!e->vocab_difference.empty() && (!cospec::texts_round_trip(e->target.vocab, e->draft.vocab, why) ||
                                                 !cospec::texts_round_trip(e->draft.vocab, e->target.vocab, why))) {
                return fail(COSPEC_ERR_VOCAB_MISMATCH, "draft and target vocabularies are incompatible: " + e->vocab_difference +
                                                           ", and they do not write each other's texts (" + why + ")");
            }
        }
        // The context cannot exceed what either model was trained for.
        int32_t n_ctx = params->n_ctx > 0 ? params->n_ctx : COSPEC_DEFAULT_N_CTX;
        n_ctx = std::min(n_ctx, (int32_t) llama_model_n_ctx_train(e->target.model));
        if (e->has_draft) {
            n_ctx = std::min(n_ctx, (int32_t) llama_model_n_ctx_train(e->draft.model));
        }
        e->n_ctx = std::max(n_ctx, 8);
        e->n_batch = std::min(params->n_batch > 0 ? params->n_batch : 512, e->n_ctx);
        e->n_ubatch = std::min(params->n_ubatch > 0 ? params->n_ubatch : e->n_batch, e->n_batch);
        if (int32_t st = create_context(*params, *e, e->target, "target",
                                        flash_attn_type(params->flash_attn, params->n_gpu_layers_target, e->target.model));
            st != COSPEC_OK) {
            return st;
        }
        if (e->has_draft) {
            if (int32_t st = create_context(*params, *e, e->draft, "draft",
                                            flash_attn_type(params->flash_attn, params->n_gpu_layers_draft, e->draft.model));
                st != COSPEC_OK) {
                return st;
            }
        }
        e->repacked_bytes[0] = cospec::repacked_model_bytes(e->target.ctx);
        e->repacked_bytes[1] = cospec::repacked_model_bytes(e->draft.ctx);
        const bool mapped = e->load_mode == LLAMA_LOAD_MODE_AUTO || e->load_mode == LLAMA_LOAD_MODE_MMAP;
        for (int which = 0; which < 2 && mapped; ++which) {
            if (e->repacked_bytes[which] > 0) {
                cospec::release_mapped_pages(which == 0 ? params->target_path : params->draft_path);
            }
        }
        if (eagle3 || dflash || target_heads.n_nextn > 0) {
            const llama_context_params cp = context_params(*params, *e, e->target.flash_attn);
            llama_model * own = head_model.model;
            head_model.model = nullptr; // the head drafter frees it from here
            const int32_t st = e->head.open(e->target.model, e->target.ctx, own,
                                            dflash ? cospec::head_kind::dflash : cospec::head_kind::eagle3, cp);
            if (st != COSPEC_OK && (eagle3 || dflash)) {
                return st;
            }
            if (st != COSPEC_OK) {
                // A target whose MTP layers llama.cpp cannot run still runs as a target.
                cospec::clear_error();
                e->head.close();
            }
        }
        *out = e.release();
        return COSPEC_OK;
    } catch (const std::exception & ex) {
        return fail(COSPEC_ERR_INTERNAL, std::string("engine open failed: ") + ex.what());
    }
}

void cospec_engine_free(cospec_engine * engine) {
    delete engine;
}

void cospec_engine_abort(cospec_engine * engine) {
    if (engine != nullptr) {
        engine->abort_flag.store(true);
    }
}

void cospec_engine_reset(cospec_engine * engine) {
    if (engine == nullptr) {
        return;
    }
    for (model_slot * s : {&engine->target, &engine->draft}) {
        if (s->ctx != nullptr) {
            s->clear_cache();
        }
    }
    engine->ngram.clear(); // the texts it has seen go too: a reset engine proposes from the next prompt alone
    engine->head.clear();
    // A reset may follow an abort of the generation it replaced: the engine is ready again.
    engine->abort_flag.store(false);
}

int64_t cospec_engine_repacked_bytes(const cospec_engine * engine, int32_t which) {
    return engine != nullptr && (which == 0 || which == 1) ? engine->repacked_bytes[which] : 0;
}

const char * cospec_repack_buffer_types(void) {
    init_backend();
    return cospec::repack_buffer_types().c_str();
}

const char * cospec_repack_note(void) {
    init_backend();
    return cospec::repack_note().c_str();
}

bool cospec_engine_has_draft(const cospec_engine * engine) {
    return engine != nullptr && engine->has_draft;
}

const char * cospec_engine_head(const cospec_engine * engine) {
    return engine != nullptr && engine->head.ready() ? cospec::head_kind_name(engine->head.kind()) : nullptr;
}

const char * cospec_engine_vocab_difference(const cospec_engine * engine) {
    return engine != nullptr && engine->has_draft && !engine->vocab_difference.empty() ? engine->vocab_difference.c_str() : nullptr;
}

int32_t cospec_engine_n_ctx(const cospec_engine * engine) {
    return engine ? engine->n_ctx : 0;
}

int32_t cospec_engine_fim_tokens(const cospec_engine * engine, cospec_token * prefix, cospec_token * suffix,
                                 cospec_token * middle) {
    if (engine == nullptr || prefix == nullptr || suffix == nullptr || middle == nullptr) {
        return fail(COSPEC_ERR_INVALID_ARGUMENT, "cospec_engine_fim_tokens: NULL argument");
    }
    const llama_vocab * vocab = engine->target.vocab;
    *prefix = llama_vocab_fim_pre(vocab);
    *suffix = llama_vocab_fim_suf(vocab);
    *middle = llama_vocab_fim_mid(vocab);
    if (*prefix == LLAMA_TOKEN_NULL || *suffix == LLAMA_TOKEN_NULL || *middle == LLAMA_TOKEN_NULL) {
        return fail(COSPEC_ERR_INVALID_ARGUMENT, "the target has no fill-in-the-middle tokens");
    }
    return COSPEC_OK;
}

int32_t cospec_engine_n_vocab(const cospec_engine * engine) {
    return engine ? engine->target.n_vocab : 0;
}

static const model_slot * slot_of(const cospec_engine * engine, int32_t which) {
    if (engine == nullptr || which < 0 || which > 1 || (which == 1 && !engine->has_draft)) {
        return nullptr;
    }
    return which == 0 ? &engine->target : &engine->draft;
}

int32_t cospec_engine_n_vocab_of(const cospec_engine * engine, int32_t which) {
    const model_slot * s = slot_of(engine, which);
    return s ? s->n_vocab : 0;
}

const char * cospec_engine_chat_template(const cospec_engine * engine, int32_t which) {
    const model_slot * s = slot_of(engine, which);
    return s && s->has_chat_template ? s->chat_template.c_str() : nullptr;
}

const char * cospec_engine_model_desc(const cospec_engine * engine, int32_t which) {
    const model_slot * s = slot_of(engine, which);
    return s ? s->desc.c_str() : nullptr;
}

int32_t cospec_engine_flash_attn(const cospec_engine * engine, int32_t which) {
    const model_slot * s = slot_of(engine, which);
    return s ? (int32_t) s->flash_attn : COSPEC_FLASH_ATTN_CPU_OFF;  // llama.cpp's enum has the same values
}

int32_t cospec_engine_meta(const cospec_engine * engine, int32_t which, const char * key, char * buf, size_t buf_size) {
    const model_slot * s = slot_of(engine, which);
    if (s == nullptr || key == nullptr) {
        return -1;
    }
    return llama_model_meta_val_str(s->model, key, buf, buf_size);
}

int32_t cospec_tokenize(const cospec_engine * engine, const char * text, int32_t text_len, cospec_token * tokens,
                        int32_t n_max, bool add_special, bool parse_special) {
    return cospec_tokenize_of(engine, 0, text, text_len, tokens, n_max, add_special, parse_special);
}

int32_t cospec_tokenize_of(const cospec_engine * engine, int32_t which, const char * text, int32_t text_len,
                           cospec_token * tokens, int32_t n_max, bool add_special, bool parse_special) {
    clear_error();
    const model_slot * s = slot_of(engine, which);
    if (s == nullptr || text == nullptr || text_len < 0 || n_max < 0 || (tokens == nullptr && n_max > 0)) {
        return fail(COSPEC_ERR_INVALID_ARGUMENT, "cospec_tokenize: invalid arguments");
    }
    return llama_tokenize(s->vocab, text, text_len, tokens, n_max, add_special, parse_special);
}

int32_t cospec_token_to_piece(const cospec_engine * engine, cospec_token token, char * buf, int32_t buf_size) {
    if (engine == nullptr || token < 0 || token >= engine->target.n_vocab || buf_size < 0) {
        return 0;
    }
    return llama_token_to_piece(engine->target.vocab, token, buf, buf_size, 0, false);
}

int32_t cospec_detokenize(const cospec_engine * engine, const cospec_token * tokens, int32_t n_tokens, char * buf,
                          int32_t buf_size, bool render_special) {
    clear_error();
    if (engine == nullptr || n_tokens < 0 || (tokens == nullptr && n_tokens > 0) || buf_size < 0) {
        return fail(COSPEC_ERR_INVALID_ARGUMENT, "cospec_detokenize: invalid arguments");
    }
    for (int32_t i = 0; i < n_tokens; ++i) {
        if (tokens[i] < 0 || tokens[i] >= engine->target.n_vocab) {
            return fail(COSPEC_ERR_INVALID_ARGUMENT, "token " + std::to_string(tokens[i]) + " is outside the vocabulary");
        }
    }
    return llama_detokenize(engine->target.vocab, tokens, n_tokens, buf, buf_size, !render_special, render_special);
}

const char * cospec_token_text(const cospec_engine * engine, cospec_token token) {
    return cospec_token_text_of(engine, 0, token);
}

const char * cospec_token_text_of(const cospec_engine * engine, int32_t which, cospec_token token) {
    const model_slot * s = slot_of(engine, which);
    if (s == nullptr || token < 0 || token >= s->n_vocab) {
        return "";
    }
    return llama_vocab_get_text(s->vocab, token);
}

bool cospec_token_is_eog(const cospec_engine * engine, cospec_token token) {
    return engine != nullptr && token >= 0 && token < engine->target.n_vocab && llama_vocab_is_eog(engine->target.vocab, token);
}

cospec_token cospec_token_bos(const cospec_engine * engine) {
    return cospec_token_bos_of(engine, 0);
}

cospec_token cospec_token_eos(const cospec_engine * engine) {
    return cospec_token_eos_of(engine, 0);
}

cospec_token cospec_token_bos_of(const cospec_engine * engine, int32_t which) {
    const model_slot * s = slot_of(engine, which);
    return s != nullptr ? llama_vocab_bos(s->vocab) : -1;
}

cospec_token cospec_token_eos_of(const cospec_engine * engine, int32_t which) {
    const model_slot * s = slot_of(engine, which);
    return s != nullptr ? llama_vocab_eos(s->vocab) : -1;
}

} // extern "C"
