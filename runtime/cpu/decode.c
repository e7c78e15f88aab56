// The decoder's attention over its KV caches (runtime/decode.ts KVCache): a token just read attends to every
// position its cache holds, one row (decodeAttention) or every row of a batched step at once, the rows shared
// between the cores (decodeAttentionRows); and a decoding step's few rows through a weight matrix
// (fewRowsTimes). Part of the addon prefab_cpu.c makes.
#include "prefab_cpu.h"

typedef float v8 __attribute__((vector_size(32)));
typedef float v4 __attribute__((vector_size(16)));

// Eight lanes summed, halves to halves.
static inline float lanes(v8 acc) {
  v4 lo, hi;
  memcpy(&lo, &acc, sizeof lo), memcpy(&hi, (const char *)&acc + sizeof lo, sizeof hi);
  v4 h = lo + hi;
  return (h[0] + h[2]) + (h[1] + h[3]);
}

// One row's attention (a token just read into its cache) over n cached positions of `mem`, as decodeAttention
// describes; q's heads qs floats apart, `sc` H·n floats of scratch. Eight lanes, one AVX2 register, for each
// key's dot product, and the values' weighted sum 32 dimensions at a time in four registers across all the
// positions: sixteen lanes, and the sum kept in `out`, went through the stack and memory at every position,
// several times slower (docs/experiments.md, "A DAPO step of the default run").
static void decode_attention(const float *mem, const float *q, int qs, size_t keys, size_t values, size_t stride,
                             int n, int H, int K, int hd, int hp, float scale, float *sc, float *out) {
  int G = H / K, hd8 = hd & ~7;
  for (int h = 0; h < H; h++, sc += n) {
    const float *qh = q + (size_t)h * qs, *kh = mem + keys + (size_t)(h / G) * hp;
    const float *vh = mem + values + (size_t)(h / G) * hp;
    float max = -INFINITY, sum = 0;
    for (int t = 0; t < n; t++) {
      const float *k = kh + t * stride;
      v8 acc = {0}, x, y;
      int j = 0;
      for (; j < hd8; j += 8) memcpy(&x, qh + j, sizeof x), memcpy(&y, k + j, sizeof y), acc += x * y;
      float s = lanes(acc);
      for (; j < hd; j++) s += qh[j] * k[j];
      sc[t] = s * scale;
      max = sc[t] > max ? sc[t] : max;
    }
    for (int t = 0; t < n; t++) sum += (sc[t] = fast_exp(sc[t] - max));
    float inv = 1.0f / sum, *oh = out + (size_t)h * hd;
    int j = 0;
    for (; j + 32 <= hd; j += 32) {
      v8 a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0}, v;
      for (int t = 0; t < n; t++) {
        const float *vt = vh + t * stride + j;
        v8 p = {0};
        p += sc[t];
        memcpy(&v, vt, sizeof v), a0 += p * v;
        memcpy(&v, vt + 8, sizeof v), a1 += p * v;
        memcpy(&v, vt + 16, sizeof v), a2 += p * v;
        memcpy(&v, vt + 24, sizeof v), a3 += p * v;
      }
      a0 *= inv, a1 *= inv, a2 *= inv, a3 *= inv;
      memcpy(oh + j, &a0, sizeof a0), memcpy(oh + j + 8, &a1, sizeof a1);
      memcpy(oh + j + 16, &a2, sizeof a2), memcpy(oh + j + 24, &a3, sizeof a3);
    }
    for (; j < hd; j++) {
      float a = 0;
      for (int t = 0; t < n; t++) a += sc[t] * vh[t * stride + j];
      oh[j] = a * inv;
    }
  }
}

// decodeAttention(mem, q, keys, values, stride, n, H, K, hd, hp, scale, scores, out): one new token's attention
// over a KV cache kept in `mem` (runtime/decode.ts KVCache: offsets in floats): query head h (at q + h·hp)
// against the n cached keys of its key/value head h/G (at keys + t·stride + (h/G)·hp), softmax, and the values'
// weighted sum into out (H·hd, a separate array); `scores` (H·n floats of mem) is scratch.
napi_value js_decode_attention(napi_env env, napi_callback_info info) {
  Args a = args_of(env, info);
  float *mem = array(&a, 0, 0);
  size_t q = (size_t)number(&a, 1), keys = (size_t)number(&a, 2), values = (size_t)number(&a, 3);
  size_t stride = (size_t)number(&a, 4);
  int n = (int)number(&a, 5), H = (int)number(&a, 6), K = (int)number(&a, 7), hd = (int)number(&a, 8);
  int hp = (int)number(&a, 9);
  float scale = (float)number(&a, 10);
  size_t scores = (size_t)number(&a, 11);
  float *out = array(&a, 12, 0);
  if (!a.bad && (K <= 0 || H % K)) fail(&a, "prefab_cpu: query heads must be a multiple of key/value heads");
  if (a.bad) return NULL;
  decode_attention(mem, mem + q, hp, keys, values, stride, n, H, K, hd, hp, scale, mem + scores, out);
  return nothing(env);
}

// Below this much work (positions read × query heads × head size, over the rows) decodeAttentionRows runs on
// the calling thread: parallel() starts a thread per call, which costs more than the work it takes over here
// (docs/experiments.md, "A DAPO step of the default run").
enum { ROWS_ALONE = 1 << 18 };

typedef struct {
  float **mems;
  const float *qkv;
  const double *meta;
  float *out;
  int width, H, K, hd, hp;
  size_t stride;
  float scale;
} DecodeRows;

static void decode_rows_share(void *ctx, int from, int to) {
  DecodeRows *d = ctx;
  int most = 0;
  for (int r = from; r < to; r++) most = (int)d->meta[3 * r + 2] > most ? (int)d->meta[3 * r + 2] : most;
  float *sc = malloc(sizeof(float) * (size_t)d->H * (most > 0 ? most : 1));
  if (!sc) abort();
  for (int r = from; r < to; r++) {
    const double *m = d->meta + 3 * r;
    decode_attention(d->mems[r], d->qkv + (size_t)r * d->width, d->hd, (size_t)m[0], (size_t)m[1], d->stride,
                     (int)m[2], d->H, d->K, d->hd, d->hp, d->scale, sc, d->out + (size_t)r * d->H * d->hd);
  }
  free(sc);
}

// decodeAttentionRows(mems, qkv, meta, stride, H, K, hd, hp, scale, out): decodeAttention for R rows read
// together (runtime/decode.ts KVCache.readRows), in shares of rows on every core: row r's query is the head of
// its row of qkv (R rows of qkv.length / R floats, heads hd apart), its cache mems[r] (rows of one cache share
// it, each up to its own position), meta[3r..3r+2] its keys' and values' offsets and its n; out (R, H·hd).
napi_value js_decode_attention_rows(napi_env env, napi_callback_info info) {
  Args a = args_of(env, info);
  DecodeRows d = {0};
  uint32_t R = 0;
  if (a.n < 10 || napi_get_array_length(env, a.v[0], &R) != napi_ok) fail(&a, "prefab_cpu: expected an array of memories");
  d.qkv = array(&a, 1, 0);
  d.meta = array(&a, 2, 0);
  d.stride = (size_t)number(&a, 3);
  d.H = (int)number(&a, 4), d.K = (int)number(&a, 5), d.hd = (int)number(&a, 6), d.hp = (int)number(&a, 7);
  d.scale = (float)number(&a, 8);
  d.out = array(&a, 9, 0);
  if (!a.bad && (d.K <= 0 || d.H % d.K)) fail(&a, "prefab_cpu: query heads must be a multiple of key/value heads");
  if (a.bad || R == 0) return a.bad ? NULL : nothing(env);
  size_t qkvLength = 0;
  napi_get_typedarray_info(env, a.v[1], NULL, &qkvLength, NULL, NULL, NULL);
  d.width = (int)(qkvLength / R);
  d.mems = malloc(sizeof(float *) * R);
  if (!d.mems) {
    napi_throw_error(env, NULL, "prefab_cpu: out of memory");
    return NULL;
  }
  size_t work = 0;
  for (uint32_t r = 0; r < R && !a.bad; r++) {
    Args one = {env, {0}, 1, 0};
    napi_get_element(env, a.v[0], r, &one.v[0]);
    d.mems[r] = array(&one, 0, 0);
    if (one.bad) a.bad = 1;
    work += (size_t)d.meta[3 * r + 2] * d.H * d.hd;
  }
  if (!a.bad) parallel((int)R, decode_rows_share, &d, work < ROWS_ALONE ? ONE : 0);
  free(d.mems);
  return a.bad ? NULL : nothing(env);
}

// ---- a few rows through a weight matrix ------------------------------------------------------------------

typedef struct {
  const float *x, *w;
  float *y;
  int m, n, k;
} FewRows;

// Weight rows [4·from, 4·to) against every row of x: four weight rows at a time, each of x's rows read once
// for the four (the weights stay in L1 while the rows pass), so that the matrix is read from memory once a
// step, not once a row, and never packed (OpenBLAS's sgemm packs it even for a product of one row). Eight
// lanes, one AVX2 register: sixteen would spill four accumulators to the stack, several times slower.
static void few_rows_share(void *ctx, int from, int to) {
  const FewRows *f = ctx;
  int k = f->k, k8 = k & ~7;
  for (int j = 4 * from; j < 4 * to && j < f->n; j += 4) {
    int rows = f->n - j < 4 ? f->n - j : 4;
    const float *w[4];
    for (int r = 0; r < 4; r++) w[r] = f->w + (size_t)(j + (r < rows ? r : 0)) * k;
    for (int i = 0; i < f->m; i++) {
      const float *x = f->x + (size_t)i * k;
      v8 a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0}, xv, wv;
      for (int c = 0; c < k8; c += 8) {
        memcpy(&xv, x + c, sizeof xv);
        memcpy(&wv, w[0] + c, sizeof wv), a0 += xv * wv;
        memcpy(&wv, w[1] + c, sizeof wv), a1 += xv * wv;
        memcpy(&wv, w[2] + c, sizeof wv), a2 += xv * wv;
        memcpy(&wv, w[3] + c, sizeof wv), a3 += xv * wv;
      }
      float sums[4] = {lanes(a0), lanes(a1), lanes(a2), lanes(a3)};
      for (int r = 0; r < rows; r++) {
        for (int c = k8; c < k; c++) sums[r] += x[c] * w[r][c];
        f->y[(size_t)i * f->n + j + r] = sums[r];
      }
    }
  }
}

// fewRowsTimes(x, m, w, n, k, y): y (m, n) = x (m, k) · wᵀ for w (n, k) row-major: a decoding step's rows
// through a layer's weights, the weights' rows shared between the cores where the matrix passes 4 MiB (a
// smaller one is read faster than a thread starts).
napi_value js_few_rows_times(napi_env env, napi_callback_info info) {
  Args a = args_of(env, info);
  FewRows f = {0};
  f.x = array(&a, 0, 0);
  f.m = (int)number(&a, 1);
  f.w = array(&a, 2, 0);
  f.n = (int)number(&a, 3), f.k = (int)number(&a, 4);
  f.y = array(&a, 5, 0);
  if (a.bad || f.m <= 0 || f.n <= 0) return a.bad ? NULL : nothing(env);
  parallel((f.n + 3) / 4, few_rows_share, &f, (size_t)f.n * f.k < (1u << 20) ? ONE : 0);
  return nothing(env);
}
