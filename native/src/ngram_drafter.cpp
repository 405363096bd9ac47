#include "ngram_drafter.h"

#include <algorithm>
#include <vector>

namespace cospec {

namespace {
// How much a refusal of a continuation counts against it, against an acceptance for it: a
// continuation refused once after being accepted once weighs a third as much as a fresh one.
constexpr double REFUSAL_WEIGHT = 2.0;
// A proposal goes on only while its token has more than this share of the votes.
constexpr double MIN_VOTE_SHARE = 0.5;
// Each verified token of a bucket decays its counts by this: the estimate follows the last ~20.
constexpr double BUCKET_DECAY = 0.95;
// The prior, worth PRIOR_WEIGHT verified tokens: a match of m tokens is accepted with chance
// m / (m + PRIOR_HALF) before any is verified (2 tokens: 0.5; 12: 0.86; 32: 0.94).
constexpr double PRIOR_WEIGHT = 2.0;
constexpr double PRIOR_HALF = 2.0;
// A measured prior (a calibration) is worth this many: a few refusals in a call move it, one does not.
constexpr double CALIBRATED_PRIOR_WEIGHT = 6.0;
// The smallest match of each bucket; the last bucket is MATCH_CAP alone.
constexpr int32_t BUCKET_FLOOR[ngram_drafter::N_SUPPORT_BUCKETS] = {2, 3, 4, 5, 7, 10, 14, 20, ngram_drafter::MATCH_CAP};
} // namespace

int32_t ngram_drafter::support_bucket(int32_t match) {
    int32_t b = 0;
    while (b + 1 < N_SUPPORT_BUCKETS && match >= BUCKET_FLOOR[b + 1]) {
        b += 1;
    }
    return b;
}

double ngram_drafter::bucket_acceptance(int32_t bucket) const {
    return (bucket_accepted[bucket] + prior_weight[bucket] * bucket_prior[bucket]) /
           (bucket_accepted[bucket] + bucket_refused[bucket] + prior_weight[bucket]);
}

void ngram_drafter::monotone_acceptance(double * out) const {
    struct block {
        double value, weight;
        int32_t first, last; // buckets pooled into it
    };
    std::vector<block> pooled;
    for (int32_t b = 0; b < N_SUPPORT_BUCKETS; ++b) {
        out[b] = -1.0;
        if (!bucket_seen(b)) {
            continue;
        }
        pooled.push_back({bucket_acceptance(b), bucket_accepted[b] + bucket_refused[b], b, b});
        while (pooled.size() > 1 && pooled[pooled.size() - 2].value > pooled.back().value) {
            const block top = pooled.back();
            pooled.pop_back();
            block & below = pooled.back();
            below.value = (below.value * below.weight + top.value * top.weight) / (below.weight + top.weight);
            below.weight += top.weight;
            below.last = top.last;
        }
    }
    for (const block & p : pooled) {
        for (int32_t b = p.first; b <= p.last; ++b) {
            if (bucket_seen(b)) {
                out[b] = p.value;
            }
        }
    }
}

void ngram_drafter::set_prior(const double * acceptance) {
    for (int32_t b = 0; b < N_SUPPORT_BUCKETS; ++b) {
        const double floor = BUCKET_FLOOR[b];
        const bool measured = acceptance != nullptr && acceptance[b] >= 0.0 && acceptance[b] <= 1.0;
        bucket_prior[b] = measured ? acceptance[b] : floor / (floor + PRIOR_HALF);
        prior_weight[b] = measured ? CALIBRATED_PRIOR_WEIGHT : PRIOR_WEIGHT;
    }
}

uint64_t ngram_drafter::hash(const llama_token * tokens, int32_t n) {
    uint64_t h = 0xcbf29ce484222325ULL ^ (uint64_t) n; // FNV-1a, the length mixed in
    for (int32_t i = 0; i < n; ++i) {
        h = (h ^ (uint32_t) tokens[i]) * 0x100000001b3ULL;
    }
    return h ^ (h >> 31);
}

uint64_t ngram_drafter::outcome_key(const std::vector<llama_token> & text, llama_token next) {
    llama_token key[3] = {SEPARATOR, SEPARATOR, next};
    const size_t n = text.size();
    if (n >= 1) key[1] = text[n - 1];
    if (n >= 2) key[0] = text[n - 2];
    return hash(key, 3);
}

void ngram_drafter::clear() {
    pool.clear();
    index.clear();
    outcomes.clear();
    proposed_keys.clear();
    proposed_support.clear();
    proposed_acceptance.clear();
    current = 0;
}

void ngram_drafter::begin(const llama_token * prompt, size_t n) {
    const size_t have = pool.size() - current;
    const bool continues = have <= n && std::equal(pool.begin() + (ptrdiff_t) current, pool.end(), prompt);
    size_t from = have;
    if (!continues) {
        if (!pool.empty() && pool.back() != SEPARATOR) {
            pool.push_back(SEPARATOR);
        }
        current = pool.size();
        from = 0;
    }
    for (size_t i = from; i < n; ++i) {
        append(prompt[i]);
    }
    proposed_keys.clear();
    proposed_support.clear();
    proposed_acceptance.clear();
}

void ngram_drafter::append(llama_token token) {
    pool.push_back(token);
    index_end(pool.size() - 1);
    if (pool.size() > POOL_MAX) {
        rebuild();
    }
}

void ngram_drafter::index_end(size_t end) {
    for (int32_t n = 1; n <= INDEX_N && (size_t) n <= end + 1; ++n) {
        const size_t start = end + 1 - (size_t) n;
        if (pool[start] == SEPARATOR) {
            break; // longer n-grams would span it too
        }
        index[hash(pool.data() + start, n)].push_back((uint32_t) end);
    }
}

void ngram_drafter::rebuild() {
    // The current text stays whole: a generation matches against all of it.
    const size_t cut = std::min(pool.size() - POOL_MAX / 2, current);
    pool.erase(pool.begin(), pool.begin() + (ptrdiff_t) cut);
    current -= cut;
    index.clear();
    for (size_t i = 0; i < pool.size(); ++i) {
        if (pool[i] != SEPARATOR) {
            index_end(i);
        }
    }
    if (outcomes.size() > POOL_MAX) {
        outcomes.clear();
    }
}

void ngram_drafter::count_votes(const std::vector<llama_token> & tail, std::vector<vote> & votes) const {
    votes.clear();
    const int32_t len = (int32_t) tail.size();
    // The longest indexed n-gram with earlier occurrences decides; shorter ones would only add noise.
    for (int32_t n = std::min(INDEX_N, len); n >= 1 && votes.empty(); --n) {
        const auto it = index.find(hash(tail.data() + len - n, n));
        if (it == index.end()) {
            continue;
        }
        int32_t seen = 0;
        for (auto end = it->second.rbegin(); end != it->second.rend() && seen < CANDIDATES; ++end) {
            const size_t e = *end;
            if (e + 1 >= pool.size() || pool[e + 1] == SEPARATOR) {
                continue; // nothing follows it (the current text's own end)
            }
            int32_t match = 0;
            while (match < MATCH_CAP && match < len && (size_t) match <= e && pool[e - match] == tail[len - 1 - match]) {
                match += 1;
            }
            if (match < n) {
                continue; // a hash collision
            }
            seen += 1;
            const llama_token next = pool[e + 1];
            double weight = match;
            if (const auto o = outcomes.find(outcome_key(tail, next)); o != outcomes.end()) {
                weight *= (1.0 + o->second.accepted) / (1.0 + REFUSAL_WEIGHT * o->second.refused);
            }
            const auto v = std::find_if(votes.begin(), votes.end(), [&](const vote & x) { return x.token == next; });
            if (v == votes.end()) {
                votes.push_back({next, weight, match});
            } else {
                v->weight += weight;
                v->longest = std::max(v->longest, match);
            }
        }
    }
}

void ngram_drafter::propose(int32_t k, std::vector<llama_token> & out) {
    out.clear();
    proposed_keys.clear();
    proposed_support.clear();
    proposed_acceptance.clear();
    if (k <= 0 || pool.size() <= current) {
        return;
    }
    text.assign(pool.begin() + (ptrdiff_t) std::max(current, pool.size() - std::min(pool.size(), (size_t) MATCH_CAP)),
                pool.end());
    std::vector<vote> votes;
    while ((int32_t) out.size() < k) {
        count_votes(text, votes);
        if (votes.empty()) {
            break;
        }
        double total = 0.0;
        const vote * best = &votes[0];
        for (const vote & v : votes) {
            total += v.weight;
            best = v.weight > best->weight ? &v : best;
        }
        // A weight below MIN_MATCH is a match too short, or one the target refused since.
        if (best->longest < MIN_MATCH || best->weight < MIN_MATCH || best->weight <= MIN_VOTE_SHARE * total) {
            break;
        }
        proposed_keys.push_back(outcome_key(text, best->token));
        proposed_support.push_back(best->longest);
        proposed_acceptance.push_back(bucket_acceptance(support_bucket(best->longest)));
        out.push_back(best->token);
        text.push_back(best->token);
    }
}

void ngram_drafter::feedback(int32_t n_verified, int32_t n_accepted) {
    // Tokens past the verified ones (the tuner held them) taught nothing.
    const int32_t n = std::min((int32_t) proposed_keys.size(), std::max(n_verified, 0));
    for (int32_t i = 0; i < n; ++i) {
        const bool accepted = i < n_accepted;
        outcome & o = outcomes[proposed_keys[i]];
        (accepted ? o.accepted : o.refused) += 1;
        const int32_t b = support_bucket(proposed_support[i]);
        bucket_accepted[b] = BUCKET_DECAY * bucket_accepted[b] + (accepted ? 1.0 : 0.0);
        bucket_refused[b] = BUCKET_DECAY * bucket_refused[b] + (accepted ? 0.0 : 1.0);
        if (!accepted) {
            break;
        }
    }
    proposed_keys.clear();
    proposed_support.clear();
    proposed_acceptance.clear();
}

} // namespace cospec
