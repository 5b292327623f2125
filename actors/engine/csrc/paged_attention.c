/* Paged attention for few queries per row, read in place from the paged KV cache (fp32).
 *
 * For query t of row b (head h, KV head g = h / group), the keys seen are the slots key_lower..query_slots[b, t] of
 * row b: slot j lives at block tables[b, j / block_size], offset j % block_size. The torch path gathers each row's
 * blocks into a contiguous copy per layer and runs a masked SDPA; a decode step reads each key once here instead.
 * Scores of all heads of one query are kept in a scratch buffer (two passes: max, then exp-sum and values).
 *
 * Work is split over (row, query) with OpenMP when built with -fopenmp. The library then links libgomp.so.1,
 * which the dynamic linker resolves to the copy torch has already loaded (same soname): one thread pool, sized by
 * the calling thread's torch.set_num_threads, not a second team competing for the cores.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef float vec8 __attribute__((vector_size(32)));   /* GCC/Clang vector extension: one AVX register */

static inline vec8 load8(const float *p) {
    vec8 v;
    memcpy(&v, p, sizeof v);     /* unaligned load */
    return v;
}

typedef int32_t ivec8 __attribute__((vector_size(32)));

/* exp of 8 non-positive arguments (softmax after subtracting the max): 2^n e^r with |r| <= ln2 / 2 and a degree-7
 * Taylor polynomial for e^r (relative error ~2e-8 before rounding); arguments below -87 give 0. */
static inline vec8 exp8(vec8 x) {
    const ivec8 underflow = x < -87.0f;                    /* lanes of all ones where true */
    x = (vec8)(((ivec8)x & ~underflow) | ((ivec8)((vec8){0} - 87.0f) & underflow));
    const ivec8 n = __builtin_convertvector(x * 1.44269504088896341f - 0.5f, ivec8);   /* truncation: rounds */
    const vec8 nf = __builtin_convertvector(n, vec8);
    const vec8 r = (x - nf * 0.693359375f) + nf * 2.12194440e-4f;
    vec8 p = (vec8){0} + 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    const vec8 scale = (vec8)((n + 127) << 23);
    return (vec8)((ivec8)(p * scale) & ~underflow);
}

static inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

static inline float dot(const float *restrict a, const float *restrict b, int64_t n) {
    vec8 acc = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) acc += load8(a + i) * load8(b + i);
    float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    for (; i < n; ++i) s += a[i] * b[i];
    return s;
}

/* The run of a row's slots from j to the end of j's block (or to last): returns its length and sets *slot to slot
 * j's entries in a [blocks, block_size, kv_heads, dim] cache and *ahead to the same offset in the next block of the
 * row (this block again at the row's end), to prefetch while this block is used: blocks are scattered, and no
 * hardware prefetcher follows the jump. One division per block, none per slot. */
static inline int64_t block_run(const float *cache, const int64_t *table, int64_t j, int64_t last, int64_t block_size,
                                int64_t token_stride, const float **slot, const float **ahead) {
    const int64_t block = j / block_size, offset = j % block_size;
    const int64_t next = block + 1 <= last / block_size ? block + 1 : block;
    *slot = cache + (table[block] * block_size + offset) * token_stride;
    *ahead = cache + table[next] * block_size * token_stride;
    return min64(block_size - offset, last + 1 - j);
}

static inline void prefetch(const float *p, int64_t dim) {
    for (int64_t line = 0; line < dim; line += 16) __builtin_prefetch(p + line);
}

/* Query t of row b, all heads: fills its [Hq, D] rows of out (head stride T * D). scores holds Hq * count floats.
 * Head by head, so that the query and the output row stay in registers; the heads of one KV group read the same
 * keys and values, the second time from the core's cache. Inlined into a copy per common head size (below), where
 * the loops over dim unroll and the branch on dim folds. */
static inline __attribute__((always_inline)) void attend_query(
    const float *restrict q, const float *key_cache, const float *value_cache, const int64_t *table,
    float *restrict out, float *restrict scores, int64_t length, int64_t heads, int64_t kv_heads, const int64_t dim,
    int64_t block_size, int64_t key_lower, int64_t last, float scale) {
    const int64_t count = last - key_lower + 1, token_stride = kv_heads * dim, head_stride = length * dim;
    const int64_t group = heads / kv_heads;
    const int vectorised = dim % 8 == 0 && dim <= 256;
    for (int64_t h = 0; h < heads; ++h) {
        const float *qh = q + h * head_stride;
        const float *keys = key_cache + (h / group) * dim, *values = value_cache + (h / group) * dim;
        float *row = scores + h * count;
        float best = -INFINITY;
        for (int64_t j = key_lower; j <= last;) {
            const float *k, *ahead;
            const int64_t run = block_run(keys, table, j, last, block_size, token_stride, &k, &ahead);
            for (int64_t i = 0; i < run; ++i, ++j, k += token_stride) {
                prefetch(ahead + i * token_stride, dim);
                const float score = scale * dot(qh, k, dim);
                row[j - key_lower] = score;
                best = score > best ? score : best;
            }
        }
        float total = 0.0f;
        int64_t j = 0;
        for (; j + 8 <= count; j += 8) {
            const vec8 e = exp8(load8(row + j) - best);
            memcpy(row + j, &e, sizeof e);
            total += ((e[0] + e[1]) + (e[2] + e[3])) + ((e[4] + e[5]) + (e[6] + e[7]));
        }
        for (; j < count; ++j) {
            row[j] = expf(row[j] - best);
            total += row[j];
        }
        const float inverse = 1.0f / total;
        float *restrict o = out + h * head_stride;
        vec8 acc[32];                               /* the output row, in registers when dim is a constant */
        for (int64_t d = 0; d < dim / 8; ++d) acc[d] = (vec8){0};
        if (!vectorised) memset(o, 0, sizeof(float) * (size_t)dim);
        for (j = key_lower; j <= last;) {
            const float *v, *ahead;
            const int64_t run = block_run(values, table, j, last, block_size, token_stride, &v, &ahead);
            for (int64_t i = 0; i < run; ++i, ++j, v += token_stride) {
                prefetch(ahead + i * token_stride, dim);
                const float w = row[j - key_lower];
                if (vectorised)
                    for (int64_t d = 0; d < dim / 8; ++d) acc[d] += w * load8(v + 8 * d);
                else
                    for (int64_t d = 0; d < dim; ++d) o[d] += w * v[d];
            }
        }
        if (vectorised)
            for (int64_t d = 0; d < dim / 8; ++d) {
                const vec8 scaled = acc[d] * inverse;
                memcpy(o + 8 * d, &scaled, sizeof scaled);
            }
        else
            for (int64_t d = 0; d < dim; ++d) o[d] *= inverse;
    }
}

#define ATTEND_WITH_DIM(name, fixed)                                                                              \
    static void name(const float *q, const float *key_cache, const float *value_cache, const int64_t *table,       \
                     float *out, float *scores, int64_t length, int64_t heads, int64_t kv_heads, int64_t dim,       \
                     int64_t block_size, int64_t key_lower, int64_t last, float scale) {                           \
        (void)dim;                                                                                                  \
        attend_query(q, key_cache, value_cache, table, out, scores, length, heads, kv_heads, fixed, block_size,     \
                     key_lower, last, scale);                                                                       \
    }
ATTEND_WITH_DIM(attend_dim32, 32)
ATTEND_WITH_DIM(attend_dim64, 64)
ATTEND_WITH_DIM(attend_dim128, 128)
ATTEND_WITH_DIM(attend_any_dim, dim)

/* Returns 0; -1 when a scratch buffer cannot be allocated; -2 when a query sees no key. */
int forge_paged_attention(const float *q,          /* [B, Hq, T, D] contiguous */
                          const float *key_cache,  /* [blocks, block_size, kv_heads, D] contiguous (one layer) */
                          const float *value_cache,
                          const int64_t *tables,   /* [B, max_blocks] */
                          const int64_t *query_slots, /* [B, T] last slot each query sees */
                          float *out,              /* [B, Hq, T, D] */
                          int64_t batch, int64_t heads, int64_t length, int64_t kv_heads, int64_t dim,
                          int64_t block_size, int64_t max_blocks, int64_t key_lower, float scale) {
    const int64_t tasks = batch * length;
    int64_t longest = 1;
    for (int64_t i = 0; i < tasks; ++i) {
        if (query_slots[i] < key_lower) return -2;
        if (query_slots[i] - key_lower + 1 > longest) longest = query_slots[i] - key_lower + 1;
    }
    void (*attend)(const float *, const float *, const float *, const int64_t *, float *, float *, int64_t, int64_t,
                   int64_t, int64_t, int64_t, int64_t, int64_t, float) =
        dim == 32 ? attend_dim32 : dim == 64 ? attend_dim64 : dim == 128 ? attend_dim128 : attend_any_dim;
    int status = 0;
#pragma omp parallel if (tasks * longest > 2048)
    {
        float *scores = malloc(sizeof(float) * (size_t)(heads * longest));
        if (!scores) {
#pragma omp atomic write
            status = -1;
        }
#pragma omp for schedule(static)
        for (int64_t task = 0; task < tasks; ++task) {
            if (!scores) continue;
            const int64_t b = task / length, t = task % length;
            const int64_t offset = (b * heads * length + t) * dim;      /* head h of this query: + h * T * D */
            attend(q + offset, key_cache, value_cache, tables + b * max_blocks, out + offset, scores, length, heads,
                   kv_heads, dim, block_size, key_lower, query_slots[task], scale);
        }
        free(scores);
    }
    return status;
}
