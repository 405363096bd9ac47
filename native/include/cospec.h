// cospec.h - collaborative speculative decoding on llama.cpp.
//
// A flat C API in the style of llama.h: opaque handles, *_default_params()
// functions, int32 status codes. Every function that can fail returns a
// status (or NULL) and leaves a readable message in cospec_last_error().
// Native code never aborts the host process on bad input.
//
// One decoding step (see docs in the project README):
//   draft   the draft model proposes d_1..d_K after the verified prefix
//   verify  the target decodes [last, d_1..d_K] in one batch -> t_1..t_{K+1}
//   arbitrate  walk i = 1..K: d_i == t_i is accepted; at a mismatch the
//           arbiter keeps d_i (walk on) or the target's t_i is emitted and
//           the block ends. If every draft token survives, t_{K+1} is the
//           bonus token.
// The `target` arbiter never keeps a mismatch: that is plain speculative
// decoding, lossless with respect to the target.

#ifndef COSPEC_H
#define COSPEC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef int32_t cospec_token;

// ---------------------------------------------------------------- status codes

enum cospec_status {
    COSPEC_OK                   =  0,
    COSPEC_ERR_INVALID_ARGUMENT = -1,  // a parameter is out of range or NULL
    COSPEC_ERR_MODEL_LOAD       = -2,  // missing, unreadable, corrupt or non-GGUF model file
    COSPEC_ERR_VOCAB_MISMATCH   = -3,  // draft and target vocabularies are not compatible
    COSPEC_ERR_CONTEXT_FULL     = -4,  // the prompt does not fit the context window
    COSPEC_ERR_DECODE           = -5,  // llama_decode failed
    COSPEC_ERR_ARBITER          = -6,  // the arbiter reported an error
    COSPEC_ERR_NO_DRAFT         = -7,  // the mode needs a draft model but none was loaded
    COSPEC_ERR_CANCELLED        = -8,  // model loading was cancelled by the progress callback
    COSPEC_ERR_ADAPTER          = -9,  // a LoRA adapter could not be loaded or applied
    COSPEC_ERR_ARBITER_DRAFT    = -10, // the learned arbiter was made for another draft model
    COSPEC_ERR_INTERNAL         = -99, // unexpected failure inside native code
};

// Message of the last failure on this thread ("" when none). Valid until the
// next cospec call on the same thread.
const char * cospec_last_error(void);

// A short name for a status code ("ok", "invalid_argument", ...).
const char * cospec_status_name(int32_t status);

// Version string of this library and of the llama.cpp it runs on.
const char * cospec_version(void);

// llama.cpp's backends and the CPU features its kernels use ("CPU : SSE3 = 1 | AVX2 = 1 | ...").
// Eval records keep it: greedy tokens can differ between CPUs whose kernels round differently.
const char * cospec_system_info(void);

// Route llama.cpp's own log output: false (the default) silences it.
void cospec_set_llama_log(bool enabled);

// Whether this build of llama.cpp can offload layers to a GPU (CUDA, Metal, ...);
// without one, n_gpu_layers has no effect.
bool cospec_supports_gpu_offload(void);

// Whether this build of llama.cpp has its RPC backend (GGML_RPC=on).
bool cospec_supports_rpc(void);

// Serve this machine's devices (its GPUs, else its CPU with n_threads, 0: all cores) to engines
// on other machines (rpc_servers = "HOST:PORT"), as llama.cpp's rpc-server does. Blocks for the
// life of the process; returns only on failure. The protocol has no authentication: listen on
// a trusted network only. cache_dir (NULL: none) caches large tensors sent to it.
int32_t cospec_rpc_server_run(const char * host, int32_t port, int32_t n_threads, const char * cache_dir);

// ---------------------------------------------------------------- engine

typedef struct cospec_engine cospec_engine;

// Progress of model loading: which = 0 target, 1 draft; progress in [0, 1].
// Return false to cancel loading (cospec_engine_open then fails with
// COSPEC_ERR_CANCELLED).
typedef bool (*cospec_progress_fn)(int32_t which, float progress, void * user_data);

// Flash attention of the target and draft contexts. llama.cpp turns it on
// wherever the backend has it (auto). On a CPU its kernel is slow for the
// few-token batches that verify a block of a tiny model: the demo pair's 5-token
// verify (3.4M parameters) took 4x a one-token step with it and well under 2x
// without, so speculative decoding paid only with it off. From SmolLM2-135M up
// it is no dearer (target-only 5% faster with it on) and keeps a batch's
// attention rounding as a one-token step's (bench/RESULTS.md). So the default
// turns it off only for models below this size whose layers stay on the CPU.
#define COSPEC_FLASH_ATTN_CPU_OFF_MAX_PARAMS 100000000ull

enum cospec_flash_attn {
    COSPEC_FLASH_ATTN_CPU_OFF = -2, // off for a model under COSPEC_FLASH_ATTN_CPU_OFF_MAX_PARAMS parameters on the CPU; else auto
    COSPEC_FLASH_ATTN_AUTO    = -1, // llama.cpp's choice
    COSPEC_FLASH_ATTN_OFF     = 0,
    COSPEC_FLASH_ATTN_ON      = 1,
};

// The context window when none is asked for (n_ctx = 0).
#define COSPEC_DEFAULT_N_CTX 4096

struct cospec_engine_params {
    const char * target_path;    // GGUF file of the target model (required)
    const char * draft_path;     // GGUF file of the draft model (NULL: target-only engine), or of a
                                 // head drafter (llama.cpp's -md): the engine then has no draft model
    int32_t n_ctx;               // context window in tokens for both models (0 = COSPEC_DEFAULT_N_CTX), capped by
                                 // the context either model was trained for
    int32_t n_batch;             // largest batch for prompt processing (0 = 512)
    int32_t n_ubatch;            // largest batch one compute step runs (0 = n_batch), as llama.cpp's -ub
    int32_t n_threads;           // threads for generation (0 = all cores)
    int32_t n_threads_batch;     // threads for prompt processing and verification (0 = n_threads)
    int32_t n_gpu_layers_target; // layers to offload (-1 = all); only with a GPU build of llama.cpp
    int32_t n_gpu_layers_draft;
    bool    use_extra_buffers;   // llama.cpp's weight repacking for its CPU kernels (-nr/--no-repack turns it off);
                                 // default true, as in llama.cpp (cospec_repack_buffer_types)
    int32_t flash_attn;          // enum cospec_flash_attn; default COSPEC_FLASH_ATTN_CPU_OFF
    // "HOST:PORT[,HOST:PORT...]": put the target's offloaded layers (n_gpu_layers_target) on these
    // llama.cpp RPC servers (a build with GGML_RPC=on; see cospec_rpc_server_run); NULL or "": none.
    // A server that cannot be reached fails cospec_engine_open. One that goes away mid-generation
    // makes llama.cpp's RPC client abort the process (it fails on its own worker thread): run such
    // engines in a process of their own, as `cospec-local serve` does.
    const char * rpc_servers;
    // Element types of each model's KV cache, as llama.cpp's -ctk/-ctv (target) and -ctkd/-ctvd
    // (draft): "f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0" or "q5_1";
    // NULL or "": llama.cpp's default (f16). llama.cpp needs flash attention for a quantized V cache.
    const char * cache_type_k;
    const char * cache_type_v;
    const char * cache_type_k_draft;
    const char * cache_type_v_draft;
    // How llama.cpp loads the weights, as its -lm names it: "auto" (mmap unless a device cannot),
    // "none" (read them), "mmap", "mlock" or "mmap+mlock" (kept in RAM), "dio" (direct I/O);
    // NULL or "": auto.
    const char * load_mode;
    // Devices for each model's offloaded layers, as llama.cpp's -dev / -devd: a comma list of
    // device names (cospec_device_names), or "none" for this machine's CPU alone; NULL or "": all.
    const char * devices;
    const char * devices_draft;
    cospec_progress_fn progress_callback;
    void * progress_user_data;
    // GGUF file of a head drafter (an EAGLE-3 head or a DFlash drafter) beside the draft model
    // (NULL or "": none), so that one engine drafts with both; it loads on the draft's devices.
    const char * head_path;
};

struct cospec_engine_params cospec_engine_default_params(void);

// llama.cpp's CPU weight repacking (use_extra_buffers): at load it copies the weights it has
// multi-token kernels for (Q4_0, Q4_K, IQ4_NL on x86; AMX's layouts on Intel CPUs with AMX) into
// interleaved layouts, held in private memory. The kinds this process offers, comma-separated
// ("CPU_REPACK", "AMX,CPU_REPACK"; "" where this CPU has none), and why a kind was left out (""
// where none was): AMX is tried once in a child process and left out where its tiles do not run.
const char * cospec_repack_buffer_types(void);
const char * cospec_repack_note(void);

// The devices this build of llama.cpp can offload to, as -dev names them ("CUDA0, Metal, ..."),
// comma-separated; "" on a CPU-only build.
const char * cospec_device_names(void);

// Load both models and create their contexts. A draft with the target's
// vocabulary (same tokenizer type, BOS/EOS, sizes within 128, identical token
// texts) drafts the target's tokens. Any other draft drafts text: its
// proposals are re-encoded into the target's tokens (cospec_engine_vocab_difference
// says how the two differ), where each writes the other's texts byte for byte
// (spaces, newlines, accented and CJK characters, an emoji); a pair that does
// not is refused (*out NULL) with a message naming what differs.
int32_t cospec_engine_open(const struct cospec_engine_params * params, cospec_engine ** out);
void    cospec_engine_free(cospec_engine * engine);

// Request the running generation to stop as soon as possible. Thread-safe;
// the generation returns COSPEC_OK with stop reason COSPEC_STOP_ABORTED and
// everything produced so far.
void cospec_engine_abort(cospec_engine * engine);

bool    cospec_engine_has_draft(const cospec_engine * engine);
// Bytes of the target's (which = 0) or draft's (1) weights that llama.cpp repacked at load: private
// memory each process holds beside the mapped file (0 without repacking, or where none applied).
int64_t cospec_engine_repacked_bytes(const cospec_engine * engine, int32_t which);
// The engine's head drafter: "eagle3" or "dflash" (head_path, or a draft_path that was an EAGLE-3 head
// or a DFlash drafter and is then no draft model), "mtp" (the target carries multi-token-prediction
// layers and no head file was given) or NULL (none).
const char * cospec_engine_head(const cospec_engine * engine);
// NULL where the draft shares the target's vocabulary (or there is no draft); else how the two
// vocabularies differ: the draft's proposals then reach the target as text. Valid while the engine lives.
const char * cospec_engine_vocab_difference(const cospec_engine * engine);
int32_t cospec_engine_n_ctx(const cospec_engine * engine);
int32_t cospec_engine_n_vocab(const cospec_engine * engine);
// The target's fill-in-the-middle tokens as llama.cpp finds them (its metadata, else their usual
// spellings): prefix, suffix and middle; COSPEC_OK, or COSPEC_ERR_INVALID_ARGUMENT where it has none.
int32_t cospec_engine_fim_tokens(const cospec_engine * engine, cospec_token * prefix, cospec_token * suffix,
                                 cospec_token * middle);

// Model metadata: which = 0 target, 1 draft. Returns NULL if absent.
// cospec_engine_model_desc gives llama.cpp's one-line description.
const char * cospec_engine_chat_template(const cospec_engine * engine, int32_t which);
const char * cospec_engine_model_desc(const cospec_engine * engine, int32_t which);
// Any GGUF metadata string value of the target (which = 0) or draft (1).
// Writes at most buf_size bytes; returns the full length, or -1 if absent.
int32_t cospec_engine_meta(const cospec_engine * engine, int32_t which, const char * key, char * buf, size_t buf_size);

// Vocabulary size of the target (which = 0) or the draft (1); 0 if absent.
int32_t cospec_engine_n_vocab_of(const cospec_engine * engine, int32_t which);

// The flash-attention setting the target's (which = 0) or draft's (1) context was
// created with, the default's rule applied: COSPEC_FLASH_ATTN_AUTO (llama.cpp's
// choice: on where the backend has it), _OFF or _ON; COSPEC_FLASH_ATTN_CPU_OFF if absent.
int32_t cospec_engine_flash_attn(const cospec_engine * engine, int32_t which);

// Teacher-forced scoring: the logits of the target (which = 0) or the draft
// (1) at every position of `tokens`, row i being the model's distribution of
// the token that follows tokens[0..i]. Writes n_tokens rows of
// cospec_engine_n_vocab_of(engine, which) floats; logits_size is the number
// of floats `logits` has room for. That model's KV cache then holds `tokens`
// (a later generation reuses the common prefix). Fails with
// COSPEC_ERR_CONTEXT_FULL if the tokens do not fit the context window.
int32_t cospec_score(cospec_engine * engine, int32_t which, const cospec_token * tokens, int32_t n_tokens,
                     float * logits, size_t logits_size);

// ---------------------------------------------------------------- vocabulary

// Tokenize with the target's tokenizer. Returns the number of tokens written,
// or the negative of the number needed when n_max is too small.
int32_t cospec_tokenize(const cospec_engine * engine, const char * text, int32_t text_len,
                        cospec_token * tokens, int32_t n_max, bool add_special, bool parse_special);
// The same with the target's (which = 0) or the draft's (1) tokenizer: a draft of another
// vocabulary reads its own rendering of a conversation (cospec_generate_params.draft_prompt).
int32_t cospec_tokenize_of(const cospec_engine * engine, int32_t which, const char * text, int32_t text_len,
                           cospec_token * tokens, int32_t n_max, bool add_special, bool parse_special);

// Text of one token. Returns the number of bytes, or the negative of the
// number needed when buf_size is too small.
int32_t cospec_token_to_piece(const cospec_engine * engine, cospec_token token, char * buf, int32_t buf_size);

// Text of a token sequence (llama.cpp's detokenizer: the leading space a
// tokenizer adds is removed). Returns the number of bytes, or the negative of
// the number needed when buf_size is too small.
int32_t cospec_detokenize(const cospec_engine * engine, const cospec_token * tokens, int32_t n_tokens, char * buf,
                          int32_t buf_size, bool render_special);

// The vocabulary's text of a token, special tokens included ("<|im_end|>").
const char * cospec_token_text(const cospec_engine * engine, cospec_token token);
bool         cospec_token_is_eog(const cospec_engine * engine, cospec_token token);
cospec_token cospec_token_bos(const cospec_engine * engine);
cospec_token cospec_token_eos(const cospec_engine * engine);
// Of the target (which = 0) or the draft (1): what the draft's own chat template is rendered with.
const char * cospec_token_text_of(const cospec_engine * engine, int32_t which, cospec_token token);
cospec_token cospec_token_bos_of(const cospec_engine * engine, int32_t which);
cospec_token cospec_token_eos_of(const cospec_engine * engine, int32_t which);

// ---------------------------------------------------------------- arbiters

// What the arbiter sees of one block. Row i of the logit arrays is the
// model's distribution for position i of the block; the target's row i is
// conditioned on draft[0..i-1], so its choices after a kept mismatch stay valid.
typedef struct cospec_block {
    int32_t index;                  // block number within this generation (0, 1, ...)
    int32_t n_draft;                // K' draft tokens in this block (K' <= K)
    int32_t n_vocab_target;
    int32_t n_vocab_draft;
    const cospec_token * draft;     // [n_draft]
    const cospec_token * target;    // [n_draft + 1] the target's token at each position; the last is the bonus
    const uint8_t * mismatch;       // [n_draft] 1 where the target would not accept draft[i]
    const float * target_logits;    // [(n_draft + 1) * n_vocab_target]
    const float * draft_logits;     // [n_draft * n_vocab_draft]; NULL unless the arbiter asked for them
    const cospec_token * context;   // prompt and verified tokens; the last one is the block's first input
    int32_t n_context;              // draft[i] and target[i] sit at position n_context + i
    float temperature;              // sampling temperature of this generation (0 = greedy)
    // A draft of another vocabulary: draft[i] is the target's token for its text, and draft_logits
    // row i is the draft's distribution where it chose draft_own[i], its own token whose text holds
    // the first byte of draft[i]. draft_alt[i]: the draft's token that begins target[i]'s text, where
    // draft[i] begins with draft_own[i] (else -1). Both NULL for a draft of the target's vocabulary.
    const cospec_token * draft_own; // [n_draft]
    const cospec_token * draft_alt; // [n_draft]
    // The reply so far: context[0, n_prompt) is the prompt (the rest of the context, the reply's
    // tokens before this block), and the earlier blocks of this reply offered reply_drafted draft
    // tokens, of which the target agreed with reply_agreed (every position, reached or not).
    int32_t n_prompt;
    int32_t reply_drafted;
    int32_t reply_agreed;
} cospec_block;

// Score every mismatch position of the block at once: write p_keep[i], the
// probability of keeping draft[i], for i in [0, n_draft). Values at matched
// positions are ignored. Called once per block whose walk reaches a mismatch,
// when it reaches it: the tokens before it are already emitted (and streamed),
// and a block whose output ends first (end of generation, a stop string, the
// token budget) is never scored. Fixed rules write 0 or 1. Return 0 on success;
// anything else stops generation with COSPEC_ERR_ARBITER.
typedef int32_t (*cospec_arbiter_fn)(void * user_data, const cospec_block * block, float * p_keep);

// A decision the walk through a block actually applied (positions after the
// first rejection are never reached, so they have none).
typedef struct cospec_decision {
    int32_t block;       // cospec_block.index
    int32_t position;    // position in the block
    int32_t token_index; // index of the emitted token in the result (the kept draft token or the fallback)
    float   p_keep;      // the arbiter's probability of keeping
    bool    keep;        // what was done
} cospec_decision;

// A user arbiter: decide is required, the rest optional (NULL).
struct cospec_arbiter_callbacks {
    cospec_arbiter_fn decide;
    // A generation starts from this prompt: a stateful arbiter can prepare its caches.
    void (*begin)(void * user_data, const cospec_token * prompt, int32_t n_prompt);
    // The decisions the walk through this block applied, in block order.
    void (*taken)(void * user_data, const cospec_block * block, const cospec_decision * decisions, int32_t n_decisions);
    // Forget every cached state (cospec_engine_reset).
    void (*reset)(void * user_data);
    // Fill cospec_block.draft_logits (a copy per drafted token; off when nobody reads them).
    bool needs_draft_logits;
};

typedef struct cospec_arbiter cospec_arbiter;

// What an arbiter is. A learned arbiter's arbiter.gguf names its kind by
// cospec_arbiter_kind_name ("features" or "lora").
enum cospec_arbiter_kind {
    COSPEC_ARBITER_TARGET   = 0, // never keeps a mismatch: lossless speculative decoding
    COSPEC_ARBITER_FLY      = 1, // FLy's training-free rule
    COSPEC_ARBITER_CALLBACK = 2, // a user function (cospec_arbiter_init_callback[s])
    COSPEC_ARBITER_FEATURES = 3, // learned: a head over cospec_block_features
    COSPEC_ARBITER_LORA     = 4, // learned: a head over the LoRA-adapted draft's hidden states and the features
    COSPEC_ARBITER_AASD     = 5, // AASD's conditional verification (training-free)
};

struct cospec_fly_params {
    int32_t window;            // W: a kept mismatch needs the next W-1 draft tokens to match (default 3)
    float   entropy_threshold; // minimum target entropy (nats, temperature 1) at the mismatch (default 0.3)
    int32_t entropy_top_k;     // entropy over the top-k tokens' -p log p (FLy's reference: 3; 0 = full entropy)
};
struct cospec_fly_params cospec_fly_default_params(void);

// AASD's conditional verification: keep draft[i] where p_target(draft[i]) >= min(beta - alpha * H, max p_target),
// H the target's entropy there (nats, temperature 1). The paper (arXiv 2505.13204) names an entropy-adaptive
// threshold; this form and its defaults (alpha = beta = 0.1) are read from a public reimplementation, as the
// paper's own formula was not available here.
struct cospec_aasd_params {
    float alpha; // how fast the threshold falls with the target's entropy (default 0.1)
    float beta;  // the threshold where the target is certain (default 0.1)
};
struct cospec_aasd_params cospec_aasd_default_params(void);

// Never keeps a mismatch: plain, lossless speculative decoding.
cospec_arbiter * cospec_arbiter_init_target(void);
// FLy (arXiv 2511.22972, rule as in its reference code): keep a mismatch at i
// when the next W-1 draft tokens all match the target, the target's entropy at
// i is at least the threshold, and i is not within the last W positions of the
// block (i <= K - W - 1).
cospec_arbiter * cospec_arbiter_init_fly(struct cospec_fly_params params);
// AASD's conditional verification (above): a mismatch is kept where the target found the draft's token
// likely enough for how unsure it was.
cospec_arbiter * cospec_arbiter_init_aasd(struct cospec_aasd_params params);
// The rules' settings checked without making the arbiter (the init functions check the same):
// COSPEC_OK, or COSPEC_ERR_INVALID_ARGUMENT with *field (when not NULL) naming the refused field
// ("window", "entropy_threshold", "entropy_top_k"; "alpha", "beta") and cospec_last_error()
// reading "fly: FIELD: why" / "aasd: FIELD: why".
int32_t cospec_fly_params_check(const struct cospec_fly_params * params, const char ** field);
int32_t cospec_aasd_params_check(const struct cospec_aasd_params * params, const char ** field);
// A user function, e.g. a Python arbiter for experiments and training.
cospec_arbiter * cospec_arbiter_init_callback(const char * name, cospec_arbiter_fn fn, void * user_data);
cospec_arbiter * cospec_arbiter_init_callbacks(const char * name, const struct cospec_arbiter_callbacks * callbacks,
                                               void * user_data);
void             cospec_arbiter_free(cospec_arbiter * arbiter);
const char *     cospec_arbiter_name(const cospec_arbiter * arbiter);
// enum cospec_arbiter_kind (-1 for NULL)
int32_t          cospec_arbiter_get_kind(const cospec_arbiter * arbiter);
// "target", "fly", "callback", "features", "lora", "aasd"; NULL for a value that is no kind.
const char *     cospec_arbiter_kind_name(int32_t kind);
// Keep a mismatch when P(keep) >= this (unless decisions are sampled). 0.5 for fixed rules.
float            cospec_arbiter_threshold(const cospec_arbiter * arbiter);
// Forget the arbiter's cached state (a LoRA arbiter's prefix cache; a callback arbiter's reset).
void             cospec_arbiter_reset(cospec_arbiter * arbiter);
// False only for the target arbiter: whether the arbiter can ever keep a mismatch.
bool             cospec_arbiter_can_keep(const cospec_arbiter * arbiter);
// Score a block directly (for tests and tools): p_keep[n_draft].
int32_t          cospec_arbiter_score(cospec_arbiter * arbiter, const cospec_block * block, float * p_keep);

// Shannon entropy (nats) of softmax(logits / temperature); temperature <= 0 means 1.
float cospec_entropy(const float * logits, int32_t n_vocab, float temperature);

// ---------------------------------------------------------------- learned arbiters

// Per-position features of a block, read off its logits with no extra forward
// pass: the input of the `features` arbiter, and part of the LoRA arbiter's.
// Needs block->draft_logits. Writes n_draft rows of COSPEC_N_FEATURES floats.
// Features are only ever appended: an arbiter trained on the first n of them
// (its file's n_features) reads the first n of each row.
#define COSPEC_N_FEATURES 22
int32_t      cospec_block_features(const cospec_block * block, float * out, size_t out_size);
const char * cospec_feature_name(int32_t index);

// The draft model's final hidden state at a prompt's last token (target tokens; the draft's own
// tokens of its text where the vocabularies differ; it reads the last 256), L2-normalised: what an
// arbiter's embedding gate reads. Writes n_embd floats to out; returns n_embd, or a
// negative status.
int32_t      cospec_prompt_embedding(cospec_engine * engine, const cospec_token * prompt, int32_t n_prompt,
                                     float * out, size_t out_size);

// Fingerprint of a GGUF model file: a 64-bit hash (hex) of its tensors'
// names, types, shapes and data. An arbiter records its draft's.
// Returns the length written (16), or a negative status.
int32_t cospec_model_fingerprint(const char * path, char * buf, size_t buf_size);

// Head of a learned arbiter run outside the engine (e.g. ONNX Runtime): map
// n_rows input rows of n_cols floats (one per mismatch position) to P(keep).
typedef int32_t (*cospec_head_fn)(void * user_data, const float * inputs, int32_t n_rows, int32_t n_cols, float * p_keep);

// The arbiter.gguf format version this engine reads (cospec_local/arbiter/file_format.py writes it).
// 2: a lora arbiter's file says where its adapter applies (lora_context).
#define COSPEC_ARBITER_FORMAT_VERSION 2

struct cospec_learned_arbiter_params {
    const char * path;        // the arbiter: its folder, or the arbiter.gguf inside it
    float threshold;          // keep when P(keep) >= threshold; < 0: the arbiter's own (default -1)
    cospec_head_fn head;      // NULL: run the head natively (default); else call this with the head inputs
    void * head_user_data;
    int32_t n_threads;        // threads of the LoRA arbiter's draft pass (0 = as the engine's generation)
    bool fold_adapter;        // LoRA arbiter: run a copy of the draft with the adapter folded into its
                              // weights (W + s BA, F32) where those weights take at most 64 MiB as F32,
                              // instead of applying the adapter at every decode (default true)
    bool use_gate;            // abstain on a prompt the arbiter's domain gate refuses (one it learned
                              // nothing about): the generation is then lossless speculative decoding
                              // (default true; arbiters without a gate admit every prompt)
};
struct cospec_learned_arbiter_params cospec_learned_arbiter_default_params(void);

// Load a learned arbiter (kind `features` or `lora`) for this engine's draft.
// It reuses the engine's draft model (a LoRA arbiter adds one llama.cpp context
// with the adapter attached) and must be freed before the engine. Fails with
// COSPEC_ERR_ARBITER when the files are missing, truncated or corrupt, with
// COSPEC_ERR_ARBITER_DRAFT when the arbiter was made for another draft (its
// recorded fingerprint is not this draft's: a caller can offer the arbiters
// that fit), and with COSPEC_ERR_ADAPTER when llama.cpp refuses the LoRA
// adapter (shapes that do not fit the draft).
int32_t cospec_arbiter_load(cospec_engine * engine, const struct cospec_learned_arbiter_params * params,
                            cospec_arbiter ** out);
// A learned arbiter's metadata (string values of its arbiter.gguf: "kind",
// "draft_fingerprint", ...); NULL if absent or not a learned arbiter. A LoRA
// arbiter also answers "adapter_use": "folded" or "decode" (fold_adapter).
// The domain gate (arbiters that have one: "gate_threshold") scores a prompt in [0, 1]: a
// coverage gate, the share of its adjacent token pairs seen in the training prompts; a
// classifier gate, the probability that it is one of the arbiter's tasks (logistic regression
// over its hashed token unigrams and bigrams); an embedding gate, the probability that it asks
// for a short, checkable answer (logistic regression over cospec_prompt_embedding: the draft reads
// the prompt once more, in a context of its own). Below the threshold the arbiter abstains for
// that generation, as it does where an embedding gate cannot read the prompt.
const char * cospec_arbiter_meta(const cospec_arbiter * arbiter, const char * key);
// The head's input rows of a block (what `head` would receive), one per
// position of the block, for parity checks: n_draft * cols floats; returns
// cols, or a negative status.
int32_t cospec_arbiter_head_inputs(cospec_arbiter * arbiter, const cospec_block * block, float * out, size_t out_size);
// The domain gate's score of a prompt (above), in [0, 1]; a negative status for an arbiter without a gate.
float   cospec_arbiter_gate_coverage(const cospec_arbiter * arbiter, const cospec_token * prompt, int32_t n_prompt);
// Whether the arbiter decides this prompt's mismatches (false: its gate refuses the prompt).
bool    cospec_arbiter_admits(const cospec_arbiter * arbiter, const cospec_token * prompt, int32_t n_prompt);

// ---------------------------------------------------------------- generation

enum cospec_mode {
    COSPEC_MODE_SPECULATIVE = 0, // draft -> verify -> arbitrate
    COSPEC_MODE_TARGET_ONLY = 1, // plain decoding with the target
    COSPEC_MODE_DRAFT_ONLY  = 2, // plain decoding with the draft
};

// Where an emitted token came from.
enum cospec_provenance {
    COSPEC_PROV_MATCH    = 0, // draft token the target agreed with
    COSPEC_PROV_KEPT     = 1, // draft token kept by the arbiter at a mismatch
    COSPEC_PROV_FALLBACK = 2, // target token emitted where the arbiter rejected a mismatch
    COSPEC_PROV_BONUS    = 3, // target token after a block that survived whole
    COSPEC_PROV_TARGET   = 4, // a plain target step (target-only mode, or a step that drafted nothing)
    COSPEC_PROV_DRAFT    = 5, // draft-only decoding
    COSPEC_PROV_NGRAM    = 6, // n-gram drafter token the target agreed with
    COSPEC_PROV_HEAD     = 7, // head drafter token (EAGLE-3, MTP) the target agreed with
};

enum cospec_stop_reason {
    COSPEC_STOP_NONE         = 0, // still running (seen only by callbacks)
    COSPEC_STOP_EOG          = 1, // end-of-generation token
    COSPEC_STOP_MAX_TOKENS   = 2, // n_predict reached
    COSPEC_STOP_STRING       = 3, // a stop string was produced (it is not part of the text)
    COSPEC_STOP_CONTEXT_FULL = 4, // the context window filled up
    COSPEC_STOP_ABORTED      = 5, // cospec_engine_abort or the callback asked to stop
    COSPEC_STOP_ERROR        = 6, // an error stopped generation; the text so far is kept
};

// A token's log-probability: log softmax of the logits of the model that chose it (temperature 1,
// before the repeat penalty, sampling and a grammar), as OpenAI's logprobs and llama-server's.
typedef struct cospec_token_logprob {
    cospec_token token;
    float        logprob;
} cospec_token_logprob;

// The most tokens a generation lists per emitted token beside its own (OpenAI's top_logprobs).
#define COSPEC_N_TOP_LOGPROBS_MAX 20

// One emitted token, as the streaming callback sees it.
typedef struct cospec_token_event {
    cospec_token token;      // -1 in the last call, which only flushes held-back text
    int32_t provenance;      // enum cospec_provenance; -1 with token -1
    // The bytes that are now safe to show (held back while they could begin a stop string or an
    // incomplete UTF-8 character): concatenating every event's text gives the final text.
    const char * text;
    int32_t text_len;
    // With cospec_generate_params.logprobs: the token's own log-probability, then the n_top
    // likeliest tokens at its position, likeliest first ([1 + n_top]); else NULL.
    const cospec_token_logprob * logprobs;
    int32_t n_top;
} cospec_token_event;

// Streaming: called once per emitted token, in order, then once with token -1.
// Return false to stop generation (stop reason ABORTED).
typedef bool (*cospec_token_fn)(const cospec_token_event * event, void * user_data);

// The one set of generation defaults (cospec_generate_default_params); the
// bindings, the Python API and the CLI read theirs from here.
// Verify cost of the timing-free length model (see cospec_generate_params)
// where neither the call nor its arbiter sets one.
#define COSPEC_DEFAULT_VERIFY_COST 0.25f

// The longest block n_draft allows; its verify decodes at most 64 tokens (the
// K draft tokens and the token before them).
#define COSPEC_N_DRAFT_MAX 63

// Where a block's draft tokens come from: cospec_generate_params.draft_sources lists them in order
// of precedence, and each block takes the first that proposes something (the draft model always
// does; the n-gram drafter where the text's end occurred before). With adaptive_draft each
// source's block length comes from its own acceptance and the target's costs, so a source that
// does not pay drafts nothing: measured as the engine runs (from its calibration) in greedy calls
// with the target arbiter, and in a call whose output may not depend on timing (an arbiter that
// keeps, sampling) from the calibration's fixed costs and the call's own acceptance counts.
enum cospec_draft_source {
    COSPEC_DRAFT_NONE  = 0, // ends the list; a list that starts with it drafts nothing
    COSPEC_DRAFT_MODEL = 1, // the draft model (skipped where the engine has none)
    COSPEC_DRAFT_NGRAM = 2, // the n-gram drafter: what followed the longest earlier match of the text's end
    // The default: the n-gram drafter, then the draft model. An arbiter that keeps mismatches
    // decides the draft model's alone: at an n-gram block's mismatch nothing is emitted and the
    // draft model drafts that position next, so the arbiter meets the mismatches it would meet
    // without the n-gram drafter, and the n-gram drafter's matched spans cost it nothing.
    COSPEC_DRAFT_AUTO  = 3,
    // The engine's head drafter (cospec_engine_head): an EAGLE-3 head opened as the draft, or the
    // target's own multi-token-prediction layers, run by llama.cpp's common/speculative.cpp. Its
    // blocks are verified losslessly; a call whose arbiter keeps mismatches does not take it.
    COSPEC_DRAFT_HEAD  = 4,
};
#define COSPEC_N_DRAFT_SOURCES 2

struct cospec_generate_params {
    int32_t mode;              // enum cospec_mode (default speculative)
    int32_t draft_sources[COSPEC_N_DRAFT_SOURCES]; // enum cospec_draft_source in order (default {AUTO, NONE})
    cospec_arbiter * arbiter;  // NULL = the target arbiter (lossless)
    int32_t n_predict;         // most tokens to generate (must be > 0; default 128)
    int32_t n_draft;           // K: most draft tokens per block (1..COSPEC_N_DRAFT_MAX; default 8)
    // Fewest draft tokens worth verifying (0..n_draft; default 0): a shorter block, as a tuner or
    // --draft-p-min leaves it, is not verified and the target steps alone (llama.cpp's --spec-draft-n-min).
    int32_t n_draft_min;
    // Most tokens of an n-gram block (1..COSPEC_N_DRAFT_MAX; default 32): a copied span is
    // drafted at no model cost and often accepted whole, so its blocks may run longer than K.
    int32_t n_draft_ngram;
    float   draft_p_min;       // stop a block early when the draft's top probability falls below this (greedy; 0 = off)
    // Choose each block's length in [0, n_draft] (default on). Greedy with the lossless
    // target arbiter it maximises measured tokens per second (wall-clock costs
    // kept across calls, starting from the engine's calibration). With an arbiter
    // that keeps a mismatch, or sampling, the output must not depend on timing:
    // the length then comes from this call's acceptance counts and a fixed cost
    // model (the engine's calibration, cospec_engine_set_calibration), never from clocks.
    bool    adaptive_draft;
    // Settings that override that fixed cost model, in target steps: one draft
    // step (<= 0, the default: the calibration's, else the learned arbiter's
    // recorded draft_cost, else the pair's parameter ratio) and each verified
    // token beyond the first (< 0, the default: the calibration's measured
    // verify costs, else the one the learned arbiter was trained under, else
    // COSPEC_DEFAULT_VERIFY_COST).
    float   draft_cost;
    float   verify_cost;
    // Sampling, in llama.cpp's order: top-k, top-p and min-p choose the candidate
    // tokens from the model's own (temperature 1) probabilities, then the
    // temperature shapes the distribution over them.
    float   temperature;       // 0 = greedy (so is anything below 1e-4)
    int32_t top_k;             // 0 = off
    float   top_p;             // 1 = off
    float   min_p;             // drop tokens below min_p x the likeliest one's probability (0 = off)
    // llama.cpp's repeat penalty: the logit of every token seen in the last
    // repeat_last_n tokens (prompt included) is divided by repeat_penalty when
    // positive, multiplied when negative. The draft and the target see the same
    // penalised history, so speculative sampling stays lossless. Arbiters read
    // the models' own logits (what they were trained on); the penalty only
    // decides which token each model proposes.
    float   repeat_penalty;    // 1 = off
    int32_t repeat_last_n;     // tokens of history it looks at (default 64; 0 = off, -1 = the whole context)
    uint64_t seed;
    // Draw each arbiter decision from Bernoulli(P(keep)) with a generator seeded
    // by `seed` (for training rollouts) instead of thresholding it (default off).
    bool    sample_arbiter;
    bool    ignore_eos;
    const char * const * stop; // stop strings
    int32_t n_stop;
    // A draft of another vocabulary (cospec_engine_vocab_difference): its own tokens for the
    // prompt, e.g. the conversation through its own chat template; the reply follows it as text.
    // NULL (the default): the target prompt's text in the draft's tokens. Draft-only decoding
    // with such a draft reads this prompt, and its result's tokens are the draft's.
    const cospec_token * draft_prompt;
    int32_t n_draft_prompt;
    // Record each emitted token's log-probability under the model whose row chose it (the target's
    // verify or step row, whatever the token's provenance: a kept draft token gets the target's
    // view of it; the draft's row in draft-only mode), and the n_top_logprobs likeliest tokens
    // there (0..COSPEC_N_TOP_LOGPROBS_MAX): cospec_result_logprobs and the token callback's event.
    bool    logprobs;          // default false
    int32_t n_top_logprobs;    // default 0
    // A grammar the output must match, in llama.cpp's GBNF (llama.cpp's json-schema-to-grammar writes
    // one from a JSON schema); NULL or "": none. The draft's proposals, the target's choices and every
    // token an arbiter keeps follow it, so the output always matches and lossless speculation gives
    // exactly target-only's constrained output. The end of generation is allowed only where the
    // grammar is complete. A grammar that does not parse fails the call with INVALID_ARGUMENT.
    const char * grammar;
    const char * grammar_root; // its start symbol (NULL: "root")
    cospec_token_fn token_callback;
    void * token_user_data;
};

struct cospec_generate_params cospec_generate_default_params(void);

// A JSON schema (its JSON text) as a GBNF grammar, by llama.cpp's own converter
// (common/json-schema-to-grammar). rule_name NULL or "root": the grammar's output is one JSON value
// of the schema. Else the schema's values are the rule rule_name, and root_rule, a GBNF expression
// that may name it, starts the grammar (e.g. "\"<tool_call>\" tool-call \"</tool_call>\"").
// Returns the grammar, valid until the next call on this thread, or NULL (cospec_last_error says why).
const char * cospec_json_schema_to_grammar(const char * schema_json, const char * rule_name, const char * root_rule);

// Whether a GBNF grammar parses for the target's (which = 0) or the draft's (1) vocabulary, with
// root as its start symbol (NULL: "root"): COSPEC_OK, else INVALID_ARGUMENT (llama.cpp's parser
// writes its reason to its log). A caller can refuse a request's grammar before generating.
int32_t cospec_grammar_check(const cospec_engine * engine, int32_t which, const char * grammar, const char * root);

// One set of counters, used by every mode.
// In speculative mode n_accepted + n_kept + n_fallback + n_bonus + n_plain == n_generated
// (n_accepted counts the n-gram drafter's matched tokens too);
// in the plain modes n_plain == n_generated.
struct cospec_stats {
    int32_t n_prompt;          // prompt tokens evaluated in this call, the last one included (it is decoded with
                               // the first step): n_prompt + n_prompt_cached is the prompt's length
    int32_t n_prompt_cached;   // prompt tokens reused from the previous call's cache
    double  t_prompt_ms;
    int32_t n_generated;
    double  t_generate_ms;
    int32_t n_blocks;          // verification passes of the target over at least one draft token
    int32_t n_drafted;         // draft tokens proposed
    int32_t n_accepted;        // emitted draft tokens that matched the target
    int32_t n_kept;            // emitted draft tokens kept by the arbiter at a mismatch
    int32_t n_fallback;        // target tokens emitted at a rejected mismatch
    int32_t n_bonus;           // target tokens emitted after a block survived whole
    int32_t n_plain;           // plain steps: target-only / draft-only decoding, and speculative steps that drafted nothing
    int32_t n_arbiter_calls;   // blocks scored by the arbiter: those whose walk reached a mismatch
    double  t_arbiter_ms;
    double  t_draft_ms;        // inside draft-model llama_decode calls
    double  t_verify_ms;       // inside target-model llama_decode calls (verification or plain steps)
    double  t_sample_ms;       // choosing tokens from logits (argmax, sampling, acceptance tests)
    bool    arbiter_abstained; // the learned arbiter's domain gate refused the prompt: lossless speculative decoding
    int32_t n_target_decoded;  // tokens the target decoded after the prompt (verify batches, plain steps, catch-ups)
    int32_t n_draft_decoded;   // tokens the draft model decoded after the prompt
    int32_t n_restored;        // rollbacks of a recurrent or hybrid model's memory to its saved state (either model)
    int32_t n_blocks_ngram;    // of n_blocks: drafted by the n-gram drafter
    int32_t n_drafted_ngram;   // of n_drafted: proposed by the n-gram drafter
    int32_t n_accepted_ngram;  // of n_accepted: n-gram tokens that matched the target (provenance NGRAM)
    int32_t n_blocks_head;     // of n_blocks: drafted by the head drafter
    int32_t n_drafted_head;    // of n_drafted: proposed by the head drafter
    int32_t n_accepted_head;   // of n_accepted: head tokens that matched the target (provenance HEAD)
};

typedef struct cospec_result cospec_result;

// The settings' own checks, which need no engine: known mode and draft sources, every range. The
// one authority on them: bindings ask here rather than check again. Returns COSPEC_OK, or
// COSPEC_ERR_INVALID_ARGUMENT with *field (when not NULL) set to the refused field's name in
// cospec_generate_params ("n_draft", "temperature", ...) and cospec_last_error() reading
// "FIELD: why".
int32_t cospec_generate_params_check(const struct cospec_generate_params * params, const char ** field);

// Every check cospec_generate makes before it runs, without running: the settings' own, then
// those of this engine, prompt and arbiter (a keeping arbiter needs the draft model among the
// sources, tokens inside the vocabularies, a prompt the context holds). Returns the status
// cospec_generate would, with *field naming the refused setting: a field of the params,
// "arbiter", "prompt" or "draft_prompt".
int32_t cospec_generate_check(const cospec_engine * engine, const cospec_token * prompt, int32_t n_prompt,
                              const struct cospec_generate_params * params, const char ** field);

// Generate from prompt tokens. On return *out (if not NULL) holds a result
// even when the status is an error after generation started, so nothing
// produced is lost. The KV caches keep the longest prefix shared with the
// previous call, so a chat that resends its history re-evaluates only new tokens.
int32_t cospec_generate(cospec_engine * engine, const cospec_token * prompt, int32_t n_prompt,
                        const struct cospec_generate_params * params, cospec_result ** out);

// Forget the cached prefix of both models and the n-gram drafter's pool of earlier texts, and
// clear a pending abort. Call it between
// generations (the Python layer aborts a running one and queues the reset behind it).
void cospec_engine_reset(cospec_engine * engine);

// ---------------------------------------------------------------- calibration

// What a pair costs and how often its drafts are accepted on this machine, measured once and
// stored (the Python side keeps it per pair and machine): every fresh engine starts its tuners
// from it instead of priors and exploration, and the modes whose block lengths may not depend
// on timing (an arbiter that keeps mismatches, sampling) take their lengths from its fixed
// numbers and the call's own acceptance counts, so the same calibration, inputs, settings and
// seed give the same tokens in any process.
#define COSPEC_CALIBRATION_VERSION 2
// Match lengths of the n-gram drafter share an acceptance in these buckets: 2, 3, 4, 5-6, 7-9,
// 10-13, 14-19, 20-31, 32 and longer.
#define COSPEC_N_NGRAM_BUCKETS 9
// Costs are in target steps (one plain target step = 1); an acceptance is a chance in [0, 1],
// negative where it was not measured (the engine's prior stands).
typedef struct cospec_calibration {
    int32_t version;               // COSPEC_CALIBRATION_VERSION
    double  target_step_ms;        // a plain target step, in milliseconds (> 0)
    double  verify[COSPEC_N_DRAFT_MAX + 2]; // verify[n]: the target decoding n tokens at once, n in [1, 64]; verify[1] = 1
    double  draft_first;           // a block's first draft call (it also reads the last block's two tokens); 0: no draft model
    double  draft_step;            // each later draft step
    double  catch_up;              // the draft reading one token of a longer catch-up (after plain steps)
    double  draft_acceptance;      // the chance that the draft model's next token is accepted (greedy)
    double  draft_acceptance_sampled; // the same under chat's sampling (it differs: the target's token is drawn)
    double  ngram_acceptance[COSPEC_N_NGRAM_BUCKETS]; // the n-gram drafter's, per match-length bucket
} cospec_calibration;

// Time the pair's decodes after `context` (any tokens of the target's vocabulary, at least
// one; its length sets where the costs are measured): plain target steps, verify batches of
// every size, draft steps and catch-ups. Fills out's costs and sets its acceptances to -1. The
// caches are emptied after (the n-gram drafter's pool stays).
int32_t cospec_engine_measure_costs(cospec_engine * engine, const cospec_token * context, int32_t n_context,
                                    cospec_calibration * out);
// Start the engine's tuners and n-gram acceptance from `calibration` (checked: version, finite
// values in range; else INVALID_ARGUMENT and nothing changes) and use it for the timing-free
// lengths of later calls. NULL forgets it: priors and exploration, as a fresh engine has.
int32_t cospec_engine_set_calibration(cospec_engine * engine, const cospec_calibration * calibration);
// The calibration in use (false: none), the n-gram acceptance of each match length the engine's
// drafter has verified since it opened replaced by what it learned, fitted never to fall as the
// match grows (a calibration run reads them back this way).
bool    cospec_engine_get_calibration(const cospec_engine * engine, cospec_calibration * out);

const char *               cospec_result_text(const cospec_result * result, int32_t * len);
const cospec_token *       cospec_result_tokens(const cospec_result * result, int32_t * n);
const int32_t *            cospec_result_provenance(const cospec_result * result, int32_t * n);
// With cospec_generate_params.logprobs, per emitted token *n_per_token entries (1 + n_top_logprobs):
// its own log-probability, then the likeliest tokens at its position; token i's begin at
// i * *n_per_token. NULL (*n_per_token 0) when they were not asked for.
const cospec_token_logprob * cospec_result_logprobs(const cospec_result * result, int32_t * n_per_token);
// Every arbiter decision the generation applied, in order.
const cospec_decision *    cospec_result_decisions(const cospec_result * result, int32_t * n);
int32_t                    cospec_result_stop_reason(const cospec_result * result);
int32_t                    cospec_result_status(const cospec_result * result);
const char *               cospec_result_error(const cospec_result * result);
struct cospec_stats        cospec_result_stats(const cospec_result * result);
void                       cospec_result_free(cospec_result * result);

#ifdef __cplusplus
}
#endif

#endif // COSPEC_H
