// Draft-free proposals: where the end of the text occurred before (in the prompt, the reply so
// far, or earlier generations on this engine), propose the tokens that followed it. Edits,
// reformatting, extraction and code that repeats its input copy long spans this way, at no
// model cost.
//
// Against llama.cpp's n-gram kinds (common/ngram-map.cpp, ngram-mod.cpp, ngram-cache.cpp) and
// prompt lookup (a fixed n-gram size, the most recent occurrence, its continuation copied):
//   - the longest match wins: candidates come from an index of 1- to 4-grams, and each is
//     measured backwards (up to MATCH_CAP tokens), so a 12-token match beats a recent 3-gram;
//   - several candidates vote for the next token, weighted by their match length and by how
//     often that continuation was accepted or refused before, and each token is chosen again
//     after the last (the proposal follows the best source, and leaves it where sources part);
//   - a proposal stops where the vote is split or the match too short, so it is often shorter
//     than the block the tuner allows, which costs nothing to verify;
//   - each proposed token carries the chance that the target accepts it, learned from earlier
//     proposals whose tokens had a match of the same length: in open chat a 2-token match is
//     refused more often than not, in a copied span a 20-token one almost never. The tuner
//     verifies as much of a proposal as pays at these chances, and holds the rest;
//   - the pool lives on: a chat's turns and a server's requests on one engine search every
//     text the engine has seen (bounded by POOL_MAX tokens).
#pragma once

#include "cospec.h"
#include "llama.h"

#include <cstdint>
#include <unordered_map>
#include <vector>

namespace cospec {

class ngram_drafter {
  public:
    ngram_drafter() { set_prior(nullptr); }

    static constexpr int32_t INDEX_N = 4;       // n-grams indexed: 1 to INDEX_N tokens
    static constexpr int32_t MATCH_CAP = 32;    // matches are measured up to this many tokens
    static constexpr int32_t MIN_MATCH = 2;     // each proposed token needs a match this long (one token is noise)
    static constexpr int32_t CANDIDATES = 32;   // most recent occurrences weighed per token
    static constexpr size_t POOL_MAX = 1 << 16; // tokens kept (about 10 MB with the index); beyond it the oldest half goes

    // Start a generation from `prompt`: it continues the current text where that is its prefix
    // (the next turn of a chat), else it begins a new text (the old ones stay searchable).
    void begin(const llama_token * prompt, size_t n);
    // A token joined the current text.
    void append(llama_token token);
    // Up to k tokens to follow the current text (none: no match worth verifying).
    void propose(int32_t k, std::vector<llama_token> & out);
    // For each token of the last proposal, the chance that the target accepts it given that it
    // accepted the tokens before it: the acceptance learned at that token's match length.
    const std::vector<double> & acceptance() const { return proposed_acceptance; }
    // The target verified the first n_verified tokens of the last proposal and accepted the
    // first n_accepted of them (refusing the next, if n_accepted < n_verified).
    void feedback(int32_t n_verified, int32_t n_accepted);
    // Forget the texts (a reset engine). What the target accepted at each match length stays:
    // it is a property of the model and its use, as the tuner's costs are.
    void clear();

    // Match lengths share an acceptance estimate in these buckets: 2, 3, 4, 5-6, 7-9, 10-13,
    // 14-19, 20-31, 32 (MATCH_CAP).
    static constexpr int32_t N_SUPPORT_BUCKETS = COSPEC_N_NGRAM_BUCKETS;
    static int32_t support_bucket(int32_t match);
    // The acceptance estimate of a bucket: decayed counts over a prior that rises with the match.
    double bucket_acceptance(int32_t bucket) const;
    // Priors measured for this pair (cospec_calibration.ngram_acceptance; a negative one keeps
    // the default), worth more verified tokens than the default's guess; nullptr: the defaults.
    void set_prior(const double * acceptance);
    // Whether a token of this bucket was verified since the engine opened.
    bool bucket_seen(int32_t bucket) const { return bucket_accepted[bucket] + bucket_refused[bucket] > 0.0; }
    // The acceptance of each seen bucket (-1: none seen), fitted so that a longer match is never
    // accepted less often than a shorter one (pooled adjacent violators, weighted by each bucket's
    // verified tokens): a bucket that saw a few unlucky tokens does not hold its long matches back.
    void monotone_acceptance(double * out) const;

    size_t pool_size() const { return pool.size(); }

  private:
    static constexpr llama_token SEPARATOR = -1; // between texts: no n-gram spans it

    struct vote {
        llama_token token;
        double weight;
        int32_t longest;
    };

    void index_end(size_t end); // index the n-grams that end at pool[end]
    void rebuild();             // drop the oldest half of the pool and index the rest again
    // Candidates for the token after `text` (the current text's tail and the proposal so far).
    void count_votes(const std::vector<llama_token> & text, std::vector<vote> & votes) const;
    static uint64_t hash(const llama_token * tokens, int32_t n);
    static uint64_t outcome_key(const std::vector<llama_token> & text, llama_token next);

    std::vector<llama_token> pool;
    size_t current = 0; // where the current text begins in the pool
    std::unordered_map<uint64_t, std::vector<uint32_t>> index; // n-gram hash -> positions where it ends
    struct outcome {
        float accepted = 0;
        float refused = 0;
    };
    std::unordered_map<uint64_t, outcome> outcomes; // (last 2 tokens, proposed token) -> how it went
    std::vector<uint64_t> proposed_keys;            // the last proposal's outcome keys, in order
    std::vector<int32_t> proposed_support;          // the last proposal's match length per token
    std::vector<double> proposed_acceptance;        // and its acceptance estimate per token
    double bucket_accepted[N_SUPPORT_BUCKETS] = {}; // decayed counts of verified tokens per bucket
    double bucket_refused[N_SUPPORT_BUCKETS] = {};
    double bucket_prior[N_SUPPORT_BUCKETS];         // each bucket's chance before any verified token
    double prior_weight[N_SUPPORT_BUCKETS];         // and what it is worth, in verified tokens
    mutable std::vector<llama_token> text;          // scratch: the tail matched against
};

} // namespace cospec
