// llama.cpp's CPU weight repacking. At load llama.cpp copies the weights it has kernels for
// (ggml-cpu/repack.cpp: Q4_0, Q4_K, IQ4_NL, MXFP4 in 8x8 blocks on AVX2; AMX's own layout on
// Intel CPUs with it) into interleaved layouts whose GEMMs multiply several tokens against each
// weight block at once: a verify's shape. llama.cpp does so by default; so does the engine.
//
// AMX is the one kind that depends on more than the instruction set the library was built for: the
// kernel must grant the process its tile state (ggml asks, and drops AMX where refused) and the
// CPU, or the hypervisor in front of it, must then run the tile instructions. Where a CPU reports
// AMX and a VM does not run it, the first AMX product would stop the process with SIGILL; so the
// tiles are tried once in a child process, and AMX leaves the list where the child dies.
#include "weight_repacking.h"

#include "ggml-backend.h"
#include "llama-ext.h"

#include <cerrno>
#include <cstring>
#include <mutex>
#include <string>

#if defined(__linux__)
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <sys/mman.h>
#endif

#if defined(__linux__) && defined(__x86_64__)
#include <csignal>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>
#define COSPEC_CAN_PROBE_AMX 1
#endif

namespace cospec {
namespace {

std::once_flag g_prepared;
std::string g_types;
std::string g_note;

ggml_backend_buffer_type_t * cpu_extra_buffer_types() {
    ggml_backend_dev_t cpu = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
    if (cpu == nullptr) {
        return nullptr;
    }
    auto get = (ggml_backend_dev_get_extra_bufts_t) ggml_backend_reg_get_proc_address(
        ggml_backend_dev_backend_reg(cpu), "ggml_backend_dev_get_extra_bufts");
    return get != nullptr ? get(cpu) : nullptr;
}

#ifdef COSPEC_CAN_PROBE_AMX
// Linux's arch_prctl for dynamically enabled state (asm/prctl.h, <linux/5.16): tile data is
// feature 18; a process that uses it without this permission gets SIGILL.
constexpr int ARCH_REQ_XCOMP_PERM = 0x1023;
constexpr int XFEATURE_XTILEDATA = 18;

// Configure one tile, zero it and release the tiles: the instructions every AMX product starts with.
// Encoded as bytes so that neither the compiler nor the assembler need to know AMX.
[[noreturn]] void touch_amx_tiles_and_exit(bool ask_permission) {
    const rlimit no_core {0, 0};
    setrlimit(RLIMIT_CORE, &no_core); // a SIGILL here is an answer, not a crash to keep
    // ... and the parent's handlers (Python's faulthandler, a crash reporter) must not report it
    struct sigaction plain {};
    plain.sa_handler = SIG_DFL;
    sigaction(SIGILL, &plain, nullptr);
    sigset_t ill;
    sigemptyset(&ill);
    sigaddset(&ill, SIGILL);
    sigprocmask(SIG_UNBLOCK, &ill, nullptr);
    if (ask_permission && syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) != 0) {
        _exit(3);
    }
    alignas(64) unsigned char config[64] = {};
    config[0] = 1;  // palette 1
    config[16] = 64; // tile 0: 64 bytes a row (colsb[0], little-endian)
    config[48] = 16; // tile 0: 16 rows
    asm volatile(".byte 0xc4, 0xe2, 0x78, 0x49, 0x00\n\t" // ldtilecfg (%rax)
                 ".byte 0xc4, 0xe2, 0x7b, 0x49, 0xc0\n\t" // tilezero %tmm0
                 ".byte 0xc4, 0xe2, 0x78, 0x49, 0xc0\n\t" // tilerelease
                 :
                 : "a"(config)
                 : "memory");
    _exit(0);
}

#endif

} // namespace

std::string amx_trial(bool ask_permission) {
#ifdef COSPEC_CAN_PROBE_AMX
    const pid_t pid = fork();
    if (pid < 0) {
        return "AMX left out: no child process to try its tiles in (fork failed)";
    }
    if (pid == 0) {
        // Only async-signal-safe work in the child of a threaded process: a syscall, the tiles, _exit.
        touch_amx_tiles_and_exit(ask_permission);
    }
    int status = 0;
    while (waitpid(pid, &status, 0) < 0) {
        if (errno != EINTR) {
            return "AMX left out: its trial process could not be waited for";
        }
    }
    if (WIFSIGNALED(status)) {
        const int sig = WTERMSIG(status);
        return std::string("AMX left out: its tile instructions stopped a trial process with ") +
               (sig == SIGILL ? "SIGILL" : "signal " + std::to_string(sig)) +
               " (a CPU or VM that reports AMX without running it)";
    }
    if (WEXITSTATUS(status) == 3) {
        return "AMX left out: the kernel does not grant this process AMX's tile state";
    }
    return WEXITSTATUS(status) == 0 ? "" : "AMX left out: its trial process failed";
#else
    (void) ask_permission;
    return ""; // AMX's permission is Linux's; elsewhere (Windows) ggml's own check is all there is
#endif
}

namespace {

void prepare() {
    ggml_backend_buffer_type_t * types = cpu_extra_buffer_types();
    if (types == nullptr) {
        return;
    }
    // ggml offers no switch for AMX alone; its list (null-terminated, static in ggml-cpu) is what
    // llama.cpp's loader reads, so AMX leaves the list itself.
    for (size_t i = 0; types[i] != nullptr; ++i) {
        if (std::strcmp(ggml_backend_buft_name(types[i]), "AMX") != 0) {
            continue;
        }
        g_note = amx_trial();
        if (!g_note.empty()) {
            for (size_t j = i; types[j] != nullptr; ++j) {
                types[j] = types[j + 1];
            }
        }
        break;
    }
    for (size_t i = 0; types[i] != nullptr; ++i) {
        g_types += (g_types.empty() ? "" : ",") + std::string(ggml_backend_buft_name(types[i]));
    }
}

bool is_repack_type(ggml_backend_buffer_type_t buft) {
    ggml_backend_buffer_type_t * types = cpu_extra_buffer_types();
    for (size_t i = 0; types != nullptr && types[i] != nullptr; ++i) {
        if (types[i] == buft) {
            return true;
        }
    }
    return false;
}

} // namespace

void prepare_weight_repacking() {
    std::call_once(g_prepared, prepare);
}

const std::string & repack_buffer_types() {
    prepare_weight_repacking();
    return g_types;
}

const std::string & repack_note() {
    prepare_weight_repacking();
    return g_note;
}

void release_mapped_pages(const char * path) {
#if defined(__linux__)
    char resolved[PATH_MAX];
    if (path == nullptr || realpath(path, resolved) == nullptr) {
        return;
    }
    std::FILE * maps = std::fopen("/proc/self/maps", "r");
    if (maps == nullptr) {
        return;
    }
    char line[PATH_MAX + 256];
    while (std::fgets(line, sizeof line, maps) != nullptr) {
        unsigned long start = 0, end = 0;
        char perms[8] = {};
        int name_at = 0;
        if (std::sscanf(line, "%lx-%lx %7s %*s %*s %*s %n", &start, &end, perms, &name_at) < 3 || name_at == 0) {
            continue;
        }
        std::string name(line + name_at);
        while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) {
            name.pop_back();
        }
        // read-only mappings of the file alone: llama.cpp maps its weights so
        if (name == resolved && perms[1] == '-') {
            madvise(reinterpret_cast<void *>(start), end - start, MADV_DONTNEED);
        }
    }
    std::fclose(maps);
#else
    (void) path;
#endif
}

int64_t repacked_model_bytes(const llama_context * ctx) {
    if (ctx == nullptr) {
        return 0;
    }
    int64_t bytes = 0;
    for (const auto & [buft, memory] : llama_get_memory_breakdown(ctx)) {
        if (is_repack_type(buft)) {
            bytes += (int64_t) memory.model;
        }
    }
    return bytes;
}

} // namespace cospec
