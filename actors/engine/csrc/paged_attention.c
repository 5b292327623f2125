/* Paged attention for few queries per row, read in place from the paged KV cache (fp32).
 *
 * For query t of row b (head h, KV head g = h / group), the keys seen are the slots key_lower..query_slots[b, t] of
 * row b: slot j lives at block tables[b, j / block_size], offset j % block_size. The torch path gathers each row's
 * blocks into a contiguous copy per layer and runs a masked SDPA; a decode step reads each key once here instead,
 * for all query heads of its KV group together. Scores of all heads of one query are kept in a scratch buffer (two
 * passes over the keys: scores and their max, then exp-sum and values).
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

/* Eight dot products' partial sums (one vector each) to the eight sums, in order: three rounds of pairwise adds. */
#if defined(__clang__) || __GNUC__ >= 12
#define SHUFFLE(a, b, ...) __builtin_shufflevector(a, b, __VA_ARGS__)
#else
#define SHUFFLE(a, b, ...) __builtin_shuffle(a, b, (ivec8){__VA_ARGS__})
#endif
static inline vec8 reduce8(const vec8 *p) {
    const vec8 ab = SHUFFLE(p[0], p[1], 0, 8, 2, 10, 4, 12, 6, 14) + SHUFFLE(p[0], p[1], 1, 9, 3, 11, 5, 13, 7, 15);
    const vec8 cd = SHUFFLE(p[2], p[3], 0, 8, 2, 10, 4, 12, 6, 14) + SHUFFLE(p[2], p[3], 1, 9, 3, 11, 5, 13, 7, 15);
    const vec8 ef = SHUFFLE(p[4], p[5], 0, 8, 2, 10, 4, 12, 6, 14) + SHUFFLE(p[4], p[5], 1, 9, 3, 11, 5, 13, 7, 15);
    const vec8 gh = SHUFFLE(p[6], p[7], 0, 8, 2, 10, 4, 12, 6, 14) + SHUFFLE(p[6], p[7], 1, 9, 3, 11, 5, 13, 7, 15);
    const vec8 abcd = SHUFFLE(ab, cd, 0, 1, 8, 9, 4, 5, 12, 13) + SHUFFLE(ab, cd, 2, 3, 10, 11, 6, 7, 14, 15);
    const vec8 efgh = SHUFFLE(ef, gh, 0, 1, 8, 9, 4, 5, 12, 13) + SHUFFLE(ef, gh, 2, 3, 10, 11, 6, 7, 14, 15);
    return SHUFFLE(abcd, efgh, 0, 1, 2, 3, 8, 9, 10, 11) + SHUFFLE(abcd, efgh, 4, 5, 6, 7, 12, 13, 14, 15);
}

static inline vec8 maximum8(vec8 a, vec8 b) {
    const ivec8 greater = a > b;
    return (vec8)(((ivec8)a & greater) | ((ivec8)b & ~greater));
}

static inline float max8(vec8 v) {
    float m = v[0];
    for (int i = 1; i < 8; ++i) m = v[i] > m ? v[i] : m;
    return m;
}

/* exp(row - best) in place over count scores; returns their sum. */
static inline float exp_shifted(float *row, int64_t count, float best) {
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
    return total;
}

/* Query t of row b, heads h0 .. h0 + nh - 1, which share one KV head: fills their output rows (head stride T * D).
 * Each key and value is loaded once for the nh heads, with the queries and the output rows held in registers, and
 * keys are scored eight at a time (one reduction per eight dot products). dim % 8 == 0, and dim and nh are
 * constants in each copy (ATTEND below), so the loops over them unroll. rows holds nh * count floats. */
static inline __attribute__((always_inline)) void attend_heads(
    const float *restrict q, const float *keys, const float *values, const int64_t *table, float *restrict out,
    float *restrict rows, const int64_t head_stride, const int64_t nh, const int64_t dim, int64_t token_stride,
    int64_t block_size, int64_t key_lower, int64_t last, float scale) {
    enum { MAX_HEADS = 4, MAX_VECTORS = 16 };
    const int64_t count = last - key_lower + 1, vectors = dim / 8;
    vec8 query[MAX_HEADS][MAX_VECTORS], best[MAX_HEADS];
    float best_tail[MAX_HEADS];
    for (int64_t h = 0; h < nh; ++h) {
        for (int64_t d = 0; d < vectors; ++d) query[h][d] = load8(q + h * head_stride + 8 * d) * scale;
        best[h] = (vec8){0} - INFINITY;
        best_tail[h] = -INFINITY;
    }
    for (int64_t j = key_lower; j <= last;) {
        const float *k, *ahead;
        const int64_t run = block_run(keys, table, j, last, block_size, token_stride, &k, &ahead);
        int64_t i = 0;
        for (; i + 8 <= run; i += 8, k += 8 * token_stride) {
            vec8 partial[MAX_HEADS][8];
            for (int64_t u = 0; u < 8; ++u) {
                prefetch(ahead + (i + u) * token_stride, dim);
                for (int64_t h = 0; h < nh; ++h) partial[h][u] = (vec8){0};
                for (int64_t d = 0; d < vectors; ++d) {
                    const vec8 kd = load8(k + u * token_stride + 8 * d);
                    for (int64_t h = 0; h < nh; ++h) partial[h][u] += query[h][d] * kd;
                }
            }
            for (int64_t h = 0; h < nh; ++h) {
                const vec8 scores = reduce8(partial[h]);
                memcpy(rows + h * count + (j + i - key_lower), &scores, sizeof scores);
                best[h] = maximum8(scores, best[h]);
            }
        }
        for (; i < run; ++i, k += token_stride) {
            prefetch(ahead + i * token_stride, dim);
            for (int64_t h = 0; h < nh; ++h) {
                vec8 acc = {0};
                for (int64_t d = 0; d < vectors; ++d) acc += query[h][d] * load8(k + 8 * d);
                const float score = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
                rows[h * count + j + i - key_lower] = score;
                best_tail[h] = score > best_tail[h] ? score : best_tail[h];
            }
        }
        j += run;
    }
    vec8 acc[MAX_HEADS][MAX_VECTORS];
    float inverse[MAX_HEADS];
    for (int64_t h = 0; h < nh; ++h) {
        const float top = max8(best[h]) > best_tail[h] ? max8(best[h]) : best_tail[h];
        inverse[h] = 1.0f / exp_shifted(rows + h * count, count, top);
        for (int64_t d = 0; d < vectors; ++d) acc[h][d] = (vec8){0};
    }
    for (int64_t j = key_lower; j <= last;) {
        const float *v, *ahead;
        const int64_t run = block_run(values, table, j, last, block_size, token_stride, &v, &ahead);
        for (int64_t i = 0; i < run; ++i, ++j, v += token_stride) {
            prefetch(ahead + i * token_stride, dim);
            for (int64_t d = 0; d < vectors; ++d) {
                const vec8 vd = load8(v + 8 * d);
                for (int64_t h = 0; h < nh; ++h) acc[h][d] += rows[h * count + j - key_lower] * vd;
            }
        }
    }
    for (int64_t h = 0; h < nh; ++h)
        for (int64_t d = 0; d < vectors; ++d) {
            const vec8 scaled = acc[h][d] * inverse[h];
            memcpy(out + h * head_stride + 8 * d, &scaled, sizeof scaled);
        }
}

/* Any head size, one head at a time, scalar: the fallback for sizes that are not a multiple of 8 (or over 128). */
static void attend_head_scalar(const float *q, const float *keys, const float *values, const int64_t *table,
                               float *out, float *row, int64_t dim, int64_t token_stride, int64_t block_size,
                               int64_t key_lower, int64_t last, float scale) {
    const int64_t count = last - key_lower + 1;
    float best = -INFINITY;
    for (int64_t j = key_lower; j <= last;) {
        const float *k, *ahead;
        const int64_t run = block_run(keys, table, j, last, block_size, token_stride, &k, &ahead);
        for (int64_t i = 0; i < run; ++i, ++j, k += token_stride) {
            float score = 0.0f;
            for (int64_t d = 0; d < dim; ++d) score += q[d] * k[d];
            row[j - key_lower] = score * scale;
            best = row[j - key_lower] > best ? row[j - key_lower] : best;
        }
    }
    const float inverse = 1.0f / exp_shifted(row, count, best);
    memset(out, 0, sizeof(float) * (size_t)dim);
    for (int64_t j = key_lower; j <= last;) {
        const float *v, *ahead;
        const int64_t run = block_run(values, table, j, last, block_size, token_stride, &v, &ahead);
        for (int64_t i = 0; i < run; ++i, ++j, v += token_stride)
            for (int64_t d = 0; d < dim; ++d) out[d] += row[j - key_lower] * v[d];
    }
    for (int64_t d = 0; d < dim; ++d) out[d] *= inverse;
}

typedef void (*attend_fn)(const float *, const float *, const float *, const int64_t *, float *, float *, int64_t,
                          int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, float);

/* All heads of query t of row b, in passes of nh heads of one KV group; a copy per (head size, heads per pass). */
#define ATTEND(name, fixed_dim, fixed_nh)                                                                          \
    static void name(const float *q, const float *key_cache, const float *value_cache, const int64_t *table,       \
                     float *out, float *scores, int64_t length, int64_t heads, int64_t kv_heads, int64_t dim,       \
                     int64_t block_size, int64_t key_lower, int64_t last, float scale) {                           \
        const int64_t group = heads / kv_heads, head_stride = length * dim, count = last - key_lower + 1;          \
        for (int64_t h = 0; h < heads; h += fixed_nh) {                                                             \
            const int64_t g = h / group;                                                                            \
            attend_heads(q + h * head_stride, key_cache + g * dim, value_cache + g * dim, table,                    \
                         out + h * head_stride, scores + h * count, head_stride, fixed_nh, fixed_dim,               \
                         kv_heads * dim, block_size, key_lower, last, scale);                                       \
        }                                                                                                           \
    }
ATTEND(attend_d32_h4, 32, 4)
ATTEND(attend_d32_h2, 32, 2)
ATTEND(attend_d32_h1, 32, 1)
ATTEND(attend_d64_h2, 64, 2)
ATTEND(attend_d64_h1, 64, 1)
ATTEND(attend_d128_h1, 128, 1)
ATTEND(attend_d8k_h1, dim, 1)

static void attend_any_dim(const float *q, const float *key_cache, const float *value_cache, const int64_t *table,
                           float *out, float *scores, int64_t length, int64_t heads, int64_t kv_heads, int64_t dim,
                           int64_t block_size, int64_t key_lower, int64_t last, float scale) {
    const int64_t group = heads / kv_heads, head_stride = length * dim;
    for (int64_t h = 0; h < heads; ++h)
        attend_head_scalar(q + h * head_stride, key_cache + (h / group) * dim, value_cache + (h / group) * dim, table,
                           out + h * head_stride, scores, dim, kv_heads * dim, block_size, key_lower, last, scale);
}

/* The copy for this head size, with as many heads of a KV group per pass as keep queries and outputs in registers
 * (nh * dim <= 128 floats, nh dividing the group). */
static attend_fn choose(int64_t dim, int64_t group) {
    if (dim == 32) return group % 4 == 0 ? attend_d32_h4 : group % 2 == 0 ? attend_d32_h2 : attend_d32_h1;
    if (dim == 64) return group % 2 == 0 ? attend_d64_h2 : attend_d64_h1;
    if (dim == 128) return attend_d128_h1;
    if (dim % 8 == 0 && dim <= 128) return attend_d8k_h1;
    return attend_any_dim;
}

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
    const attend_fn attend = choose(dim, heads / kv_heads);
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
