// Python bindings of the C API (module cospec_local._cospec): the module's constants, defaults
// and free functions here; the arbiter (arbiter_binding.cpp) and the engine (engine_binding.cpp)
// in files of their own, over native_call.h. Native work runs with the GIL released on one
// compute thread; callbacks into Python take the GIL back.
#include "arbiter_binding.h"
#include "engine_binding.h"
#include "native_call.h"

#include <optional>
#include <string>
#include <vector>

using namespace cospec_python;

PYBIND11_MODULE(_cospec, m) {
    m.doc() = "Native collaborative speculative decoding engine on llama.cpp";

    // Owned by the module for the life of the process (never freed on purpose).
    static PyObject * cospec_error = PyErr_NewException("cospec_local._cospec.CospecError", PyExc_RuntimeError, nullptr);
    m.add_object("CospecError", py::handle(cospec_error).inc_ref());
    py::register_exception_translator([](std::exception_ptr p) {
        try {
            if (p) {
                std::rethrow_exception(p);
            }
        } catch (const native_error & e) {
            py::tuple args = py::make_tuple(e.status, cospec_status_name(e.status), e.message);
            PyErr_SetObject(cospec_error, args.ptr());
        }
    });

    m.def("version", &cospec_version);
    m.def("system_info", &cospec_system_info);
    m.def("status_name", &cospec_status_name, py::arg("status"));
    m.def("set_llama_log", &cospec_set_llama_log, py::arg("enabled"));
    m.def("device_names", [] { return std::string(cospec_device_names()); },
          "The devices this llama.cpp build offloads to, as -dev names them (comma-separated; '' on a CPU build).");
    m.def("supports_gpu_offload", &cospec_supports_gpu_offload);
    m.def("repack_buffer_types", [] { return std::string(cospec_repack_buffer_types()); },
          "llama.cpp's kinds of repacked CPU weights in this process, comma-separated ('' where this CPU has none).");
    m.def("repack_note", [] { return std::string(cospec_repack_note()); },
          "Why a kind of repacked weights was left out ('' where none was: AMX where its tiles do not run).");
    m.def("supports_rpc", &cospec_supports_rpc);
    // Blocks for the life of the process (the GIL released); raises if the server cannot start.
    m.def("rpc_server_run", [](const std::string & host, int32_t port, int32_t n_threads, std::optional<std::string> cache_dir) {
        int32_t status;
        std::string message;
        {
            py::gil_scoped_release released;
            status = cospec_rpc_server_run(host.c_str(), port, n_threads, cache_dir ? cache_dir->c_str() : nullptr);
            message = cospec_last_error();
        }
        throw native_error {status, message};
    }, py::arg("host"), py::arg("port"), py::arg("n_threads") = 0, py::arg("cache_dir") = py::none());
    m.def("entropy", [](py::array_t<float, py::array::c_style | py::array::forcecast> logits, float temperature) {
        return cospec_entropy(logits.data(), (int32_t) logits.size(), temperature);
    }, py::arg("logits"), py::arg("temperature") = 1.0f);

    m.attr("MODE_SPECULATIVE") = (int) COSPEC_MODE_SPECULATIVE;
    m.attr("MODE_TARGET_ONLY") = (int) COSPEC_MODE_TARGET_ONLY;
    m.attr("MODE_DRAFT_ONLY") = (int) COSPEC_MODE_DRAFT_ONLY;
    m.attr("PROV_MATCH") = (int) COSPEC_PROV_MATCH;
    m.attr("PROV_KEPT") = (int) COSPEC_PROV_KEPT;
    m.attr("PROV_FALLBACK") = (int) COSPEC_PROV_FALLBACK;
    m.attr("PROV_BONUS") = (int) COSPEC_PROV_BONUS;
    m.attr("PROV_TARGET") = (int) COSPEC_PROV_TARGET;
    m.attr("PROV_DRAFT") = (int) COSPEC_PROV_DRAFT;
    m.attr("PROV_NGRAM") = (int) COSPEC_PROV_NGRAM;
    m.attr("PROV_HEAD") = (int) COSPEC_PROV_HEAD;
    m.attr("DRAFT_NONE") = (int) COSPEC_DRAFT_NONE;
    m.attr("DRAFT_MODEL") = (int) COSPEC_DRAFT_MODEL;
    m.attr("DRAFT_NGRAM") = (int) COSPEC_DRAFT_NGRAM;
    m.attr("DRAFT_AUTO") = (int) COSPEC_DRAFT_AUTO;
    m.attr("DRAFT_HEAD") = (int) COSPEC_DRAFT_HEAD;
    m.attr("FLASH_ATTN_AUTO") = (int) COSPEC_FLASH_ATTN_AUTO;
    m.attr("FLASH_ATTN_CPU_OFF_MAX_PARAMS") = (unsigned long long) COSPEC_FLASH_ATTN_CPU_OFF_MAX_PARAMS;
    m.attr("FLASH_ATTN_OFF") = (int) COSPEC_FLASH_ATTN_OFF;
    m.attr("FLASH_ATTN_ON") = (int) COSPEC_FLASH_ATTN_ON;
    m.attr("STOP_EOG") = (int) COSPEC_STOP_EOG;
    m.attr("STOP_MAX_TOKENS") = (int) COSPEC_STOP_MAX_TOKENS;
    m.attr("STOP_STRING") = (int) COSPEC_STOP_STRING;
    m.attr("STOP_CONTEXT_FULL") = (int) COSPEC_STOP_CONTEXT_FULL;
    m.attr("STOP_ABORTED") = (int) COSPEC_STOP_ABORTED;
    m.attr("STOP_ERROR") = (int) COSPEC_STOP_ERROR;
    m.attr("N_FEATURES") = (int) COSPEC_N_FEATURES;
    {
        const cospec_learned_arbiter_params lp = cospec_learned_arbiter_default_params();
        py::dict d;
        d["fold_adapter"] = lp.fold_adapter;
        d["use_gate"] = lp.use_gate;
        m.attr("LEARNED_ARBITER_DEFAULTS") = d;
    }
    m.attr("ARBITER_FORMAT_VERSION") = (int) COSPEC_ARBITER_FORMAT_VERSION;
    m.attr("N_DRAFT_MAX") = (int) COSPEC_N_DRAFT_MAX;
    m.attr("ARBITER_TARGET") = (int) COSPEC_ARBITER_TARGET;
    m.attr("ARBITER_FLY") = (int) COSPEC_ARBITER_FLY;
    m.attr("ARBITER_CALLBACK") = (int) COSPEC_ARBITER_CALLBACK;
    m.attr("ARBITER_FEATURES") = (int) COSPEC_ARBITER_FEATURES;
    m.attr("ARBITER_LORA") = (int) COSPEC_ARBITER_LORA;
    m.attr("ARBITER_AASD") = (int) COSPEC_ARBITER_AASD;
    m.def("arbiter_kind_name", [](int32_t kind) { return opt_str(cospec_arbiter_kind_name(kind)); }, py::arg("kind"),
          "The kind's name (arbiter.gguf's spelling of a learned one); None for a value that is no kind.");
    py::list feature_names;
    for (int32_t i = 0; i < COSPEC_N_FEATURES; ++i) {
        feature_names.append(cospec_feature_name(i));
    }
    m.attr("FEATURE_NAMES") = feature_names;

    // The one place the native defaults are read from (cospec_*_default_params).
    const cospec_fly_params fly = cospec_fly_default_params();
    py::dict fly_defaults;
    fly_defaults["window"] = fly.window;
    fly_defaults["entropy_threshold"] = fly.entropy_threshold;
    fly_defaults["entropy_top_k"] = fly.entropy_top_k;
    m.attr("FLY_DEFAULTS") = fly_defaults;
    const cospec_aasd_params aasd = cospec_aasd_default_params();
    py::dict aasd_defaults;
    aasd_defaults["alpha"] = aasd.alpha;
    aasd_defaults["beta"] = aasd.beta;
    m.attr("AASD_DEFAULTS") = aasd_defaults;
    m.attr("DEFAULT_VERIFY_COST") = COSPEC_DEFAULT_VERIFY_COST;
    m.attr("DEFAULT_N_CTX") = COSPEC_DEFAULT_N_CTX;
    m.attr("CALIBRATION_VERSION") = COSPEC_CALIBRATION_VERSION;
    m.attr("N_NGRAM_BUCKETS") = COSPEC_N_NGRAM_BUCKETS;
    m.attr("N_TOP_LOGPROBS_MAX") = COSPEC_N_TOP_LOGPROBS_MAX;
    m.def("json_schema_to_grammar", [](const std::string & schema, const std::string & rule_name, const std::string & root_rule) {
        const char * grammar = cospec_json_schema_to_grammar(schema.c_str(), rule_name.c_str(), root_rule.c_str());
        if (grammar == nullptr) {
            raise_status(COSPEC_ERR_INVALID_ARGUMENT);
        }
        return std::string(grammar);
    }, py::arg("schema"), py::arg("rule_name") = std::string(), py::arg("root_rule") = std::string(),
       "A JSON schema's grammar by llama.cpp's converter (cospec_json_schema_to_grammar).");

    py::class_<cospec_generate_params>(m, "GenerateParams",
                                       "cospec_generate_params: constructed with cospec_generate_default_params()")
        .def(py::init([] { return cospec_generate_default_params(); }))
        .def_readwrite("mode", &cospec_generate_params::mode)
        .def_property(
            "draft_sources",
            [](const cospec_generate_params & p) {
                return std::vector<int32_t>(p.draft_sources, p.draft_sources + COSPEC_N_DRAFT_SOURCES);
            },
            [](cospec_generate_params & p, const std::vector<int32_t> & sources) {
                if (sources.size() > COSPEC_N_DRAFT_SOURCES) {
                    throw py::value_error("at most " + std::to_string(COSPEC_N_DRAFT_SOURCES) + " draft sources");
                }
                std::fill(p.draft_sources, p.draft_sources + COSPEC_N_DRAFT_SOURCES, COSPEC_DRAFT_NONE);
                std::copy(sources.begin(), sources.end(), p.draft_sources);
            })
        .def_readwrite("n_predict", &cospec_generate_params::n_predict)
        .def_readwrite("n_draft", &cospec_generate_params::n_draft)
        .def_readwrite("n_draft_min", &cospec_generate_params::n_draft_min)
        .def_readwrite("n_draft_ngram", &cospec_generate_params::n_draft_ngram)
        .def_readwrite("draft_p_min", &cospec_generate_params::draft_p_min)
        .def_readwrite("draft_cost", &cospec_generate_params::draft_cost)
        .def_readwrite("verify_cost", &cospec_generate_params::verify_cost)
        .def_readwrite("adaptive_draft", &cospec_generate_params::adaptive_draft)
        .def_readwrite("temperature", &cospec_generate_params::temperature)
        .def_readwrite("top_k", &cospec_generate_params::top_k)
        .def_readwrite("top_p", &cospec_generate_params::top_p)
        .def_readwrite("min_p", &cospec_generate_params::min_p)
        .def_readwrite("repeat_penalty", &cospec_generate_params::repeat_penalty)
        .def_readwrite("repeat_last_n", &cospec_generate_params::repeat_last_n)
        .def_readwrite("seed", &cospec_generate_params::seed)
        .def_readwrite("sample_arbiter", &cospec_generate_params::sample_arbiter)
        .def_readwrite("ignore_eos", &cospec_generate_params::ignore_eos)
        .def_readwrite("logprobs", &cospec_generate_params::logprobs)
        .def_readwrite("n_top_logprobs", &cospec_generate_params::n_top_logprobs);
    m.def("generate_params_check", [](const cospec_generate_params & params) {
        const char * field = "";
        const int32_t status = cospec_generate_params_check(&params, &field);
        return refusal(status, field);
    }, py::arg("params"), "cospec_generate_params_check: None, or (status, field, message) of the first setting it refuses.");
    m.def("model_fingerprint", [](const std::string & path) {
        char buf[32];
        int32_t n;
        {
            py::gil_scoped_release release;
            n = cospec_model_fingerprint(path.c_str(), buf, sizeof(buf));
        }
        if (n < 0) {
            raise_status(n);
        }
        return std::string(buf, (size_t) n);
    }, py::arg("path"), "64-bit fingerprint (hex) of a GGUF model's tensors.");

    bind_arbiter(m);
    bind_engine(m);
}
