// The decoder's attention over its KV caches (runtime/decode.ts KVCache): every row of a step or a prompt's
// reading placed in its cache and attending to every position before it, the rows shared between the cores
// (decodeAttentionRows); the feed-forward's SwiGLU for a step's rows (swigluRows); and a decoding step's rows
// through a weight matrix kept in panels (packPanels, panelTimes). Part of the addon prefab_cpu.c makes.
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

typedef int i8 __attribute__((vector_size(32)));

// x in every lane: a broadcast (adding x to a zero vector is an add too, on the way to every use).
static inline v8 splat(float x) { return (v8){x, x, x, x, x, x, x, x}; }

// Lanes of x where `mask` is set, of y elsewhere.
static inline v8 pick(i8 mask, v8 x, v8 y) {
  i8 xi, yi;
  memcpy(&xi, &x, sizeof x), memcpy(&yi, &y, sizeof y);
  xi = (xi & mask) | (yi & ~mask), memcpy(&x, &xi, sizeof x);
  return x;
}

// Eight lanes of e^x, as fast_exp does one.
static inline v8 fast_exp8(v8 x) {
  v8 floor = splat(-87.0f), ceiling = splat(88.0f), big = splat(12582912.0f), s;
  x = pick(x < floor, floor, x), x = pick(x > ceiling, ceiling, x);
  v8 n = (x * 1.44269504088896341f + big) - big;
  v8 r = x - n * 0.693145751953125f - n * 1.428606765330187e-06f;
  v8 p = 1.0f + r * (1.0f + r * (0.5f + r * (1.6666667e-1f + r * (4.1666668e-2f + r * (8.3333338e-3f + r * 1.3888889e-3f)))));
  i8 e = (__builtin_convertvector(n, i8) + 127) << 23;
  memcpy(&s, &e, sizeof s);
  return p * s;
}

// Lane u: the sum of a[u]'s eight lanes (the pairwise sums of AVX's haddps, then the halves).
static inline v8 sums8(const v8 *a) {
#define PAIRS(x, y) (__builtin_shufflevector(x, y, 0, 2, 8, 10, 4, 6, 12, 14) + __builtin_shufflevector(x, y, 1, 3, 9, 11, 5, 7, 13, 15))
  v8 b0 = PAIRS(a[0], a[1]), b1 = PAIRS(a[2], a[3]), b2 = PAIRS(a[4], a[5]), b3 = PAIRS(a[6], a[7]);
  v8 c0 = PAIRS(b0, b1), c1 = PAIRS(b2, b3);
#undef PAIRS
  return __builtin_shufflevector(c0, c1, 0, 1, 2, 3, 8, 9, 10, 11) + __builtin_shufflevector(c0, c1, 4, 5, 6, 7, 12, 13, 14, 15);
}

typedef struct {
  int H, K, hd, hp;
  float scale;
} Heads;

// One row's attention over n positions of its cache (runtime/decode.ts KVCache: a layer's keys head by head,
// each head's positions hp floats apart, heads hs apart; the values likewise): query head h (q + h·hd) against
// key/value head h/G, softmax, the values' weighted sum into out (H·hd); `sc` n floats of scratch. The scores
// eight keys at a time, each in its own register and the eight summed together at the end (a key's dot
// product summed alone waits on its own additions), the exponentials eight at a time, and the values'
// weighted sum two positions at a time (32 dimensions, four registers each), so that no register waits on the
// one before it (docs/experiments.md, "A decoding step's attention").
static void attend_row(const float *keys, const float *values, size_t hs, int n, const float *q, const Heads *s,
                       float *sc, float *out) {
  int G = s->H / s->K, hd = s->hd, hd8 = hd & ~7, hp = s->hp;
  for (int h = 0; h < s->H; h++) {
    const float *qh = q + (size_t)h * hd, *kh = keys + (size_t)(h / G) * hs, *vh = values + (size_t)(h / G) * hs;
    float max = -INFINITY, sum = 0;
    int t = 0;
    for (; t + 8 <= n; t += 8) {
      v8 a[8] = {{0}}, x, y;
      const float *k = kh + (size_t)t * hp;
      for (int j = 0; j < hd8; j += 8) {
        memcpy(&x, qh + j, sizeof x);
        for (int u = 0; u < 8; u++) memcpy(&y, k + u * hp + j, sizeof y), a[u] += x * y;
      }
      v8 dots = sums8(a);
      for (int j = hd8; j < hd; j++)
        for (int u = 0; u < 8; u++) dots[u] += qh[j] * k[u * hp + j];
      dots *= s->scale;
      memcpy(sc + t, &dots, sizeof dots);
      for (int u = 0; u < 8; u++) max = dots[u] > max ? dots[u] : max;
    }
    for (; t < n; t++) {
      const float *k = kh + (size_t)t * hp;
      v8 acc = {0}, x, y;
      int j = 0;
      for (; j < hd8; j += 8) memcpy(&x, qh + j, sizeof x), memcpy(&y, k + j, sizeof y), acc += x * y;
      float dot = lanes(acc);
      for (; j < hd; j++) dot += qh[j] * k[j];
      sc[t] = dot * s->scale;
      max = sc[t] > max ? sc[t] : max;
    }
    v8 top = splat(max), total = {0}, e;
    for (t = 0; t + 8 <= n; t += 8)
      memcpy(&e, sc + t, sizeof e), e = fast_exp8(e - top), memcpy(sc + t, &e, sizeof e), total += e;
    for (; t < n; t++) sum += (sc[t] = fast_exp(sc[t] - max));
    float inv = 1.0f / (sum + lanes(total)), *oh = out + (size_t)h * hd;
    int j = 0;
    for (; j + 32 <= hd; j += 32) {
      v8 a[4] = {{0}}, b[4] = {{0}}, v;
      for (t = 0; t + 2 <= n; t += 2) {
        const float *v0 = vh + (size_t)t * hp + j, *v1 = v0 + hp;
        v8 p = splat(sc[t]), r = splat(sc[t + 1]);
        for (int u = 0; u < 4; u++) memcpy(&v, v0 + 8 * u, sizeof v), a[u] += p * v;
        for (int u = 0; u < 4; u++) memcpy(&v, v1 + 8 * u, sizeof v), b[u] += r * v;
      }
      for (; t < n; t++) {
        v8 p = splat(sc[t]);
        for (int u = 0; u < 4; u++) memcpy(&v, vh + (size_t)t * hp + j + 8 * u, sizeof v), a[u] += p * v;
      }
      for (int u = 0; u < 4; u++) a[u] = (a[u] + b[u]) * inv, memcpy(oh + j + 8 * u, &a[u], sizeof a[u]);
    }
    for (; j + 8 <= hd; j += 8) {
      v8 a = {0}, v;
      for (t = 0; t < n; t++) {
        v8 p = splat(sc[t]);
        memcpy(&v, vh + (size_t)t * hp + j, sizeof v), a += p * v;
      }
      a *= inv, memcpy(oh + j, &a, sizeof a);
    }
    for (; j < hd; j++) {
      float a = 0;
      for (t = 0; t < n; t++) a += sc[t] * vh[(size_t)t * hp + j];
      oh[j] = a * inv;
    }
  }
}

// Below this much work (positions read × query heads × head size, over the rows) decodeAttentionRows runs on
// the calling thread: parallel() starts a thread per call, which costs more than the work it takes over here
// (docs/experiments.md, "A DAPO step of the default run").
enum { ROWS_ALONE = 1 << 18 };

typedef struct {
  float **mems;
  float *qkv;
  const double *meta;
  const float *cos, *sin, *bias;
  float *out;
  int width;
  Heads s;
} DecodeRows;

// RoPE on one head of hd floats at a position's cos and sin (rotate-half, as model/llama.ts).
static void rotate(float *x, const float *cos, const float *sin, int hd) {
  int half = hd / 2;
  for (int f = 0; f < half; f++) {
    float a = x[f], b = x[half + f];
    x[f] = a * cos[f] - b * sin[f];
    x[half + f] = b * cos[f] + a * sin[f];
  }
}

// Each row's query, key and value: the biases added, the query's and key's heads rotated at the row's
// position, the key and value written into its cache there.
static void place_rows_share(void *ctx, int from, int to) {
  DecodeRows *d = ctx;
  const Heads *s = &d->s;
  int Q = s->H * s->hd, KV = s->K * s->hd;
  for (int r = from; r < to; r++) {
    float *row = d->qkv + (size_t)r * d->width, *mem = d->mems[r];
    const double *m = d->meta + 4 * r;
    size_t keys = (size_t)m[0], values = (size_t)m[1], hs = (size_t)m[3];
    int at = (int)m[2] - 1;
    if (d->bias)
      for (int i = 0; i < d->width; i++) row[i] += d->bias[i];
    const float *c = d->cos + (size_t)at * s->hd, *sn = d->sin + (size_t)at * s->hd;
    for (int h = 0; h < s->H + s->K; h++) rotate(row + (size_t)h * s->hd, c, sn, s->hd);
    for (int h = 0; h < s->K; h++) {
      memcpy(mem + keys + h * hs + (size_t)at * s->hp, row + Q + h * s->hd, sizeof(float) * s->hd);
      memcpy(mem + values + h * hs + (size_t)at * s->hp, row + Q + KV + h * s->hd, sizeof(float) * s->hd);
    }
  }
}

static void attend_rows_share(void *ctx, int from, int to) {
  DecodeRows *d = ctx;
  int most = 0;
  for (int r = from; r < to; r++) most = (int)d->meta[4 * r + 2] > most ? (int)d->meta[4 * r + 2] : most;
  float *sc = malloc(sizeof(float) * (most > 0 ? most : 1));
  if (!sc) abort();
  for (int r = from; r < to; r++) {
    const double *m = d->meta + 4 * r;
    const float *mem = d->mems[r];
    attend_row(mem + (size_t)m[0], mem + (size_t)m[1], (size_t)m[3], (int)m[2], d->qkv + (size_t)r * d->width, &d->s,
               sc, d->out + (size_t)r * d->s.H * d->s.hd);
  }
  free(sc);
}

// decodeAttentionRows(mems, qkv, meta, cos, sin, bias, H, K, hd, hp, out): the attention of R rows read together
// (runtime/decode.ts KVCache.readRows), each a token at its position in its cache. Row r of qkv (R rows of
// (H + 2K)·hd) is its query, key and value as projected; bias (the same width) or null is added, the query's
// and key's heads are rotated at the row's position (cos, sin: model/llama.ts ropeTable, hd floats a position),
// and the key and value are written into the row's cache mems[r] (rows of one cache share it, each at its own
// position); then every row attends to its cache up to its position. meta[4r..4r+3]: where the layer's keys and
// values start in mems[r], the positions to attend to (the row's position + 1) and the floats between two heads
// there; out (R, H·hd). Both passes in shares of rows on every core: every key is in place before any row reads.
napi_value js_decode_attention_rows(napi_env env, napi_callback_info info) {
  Args a = args_of(env, info);
  DecodeRows d = {0};
  uint32_t R = 0;
  if (a.n < 11 || napi_get_array_length(env, a.v[0], &R) != napi_ok) fail(&a, "prefab_cpu: expected an array of memories");
  d.qkv = array(&a, 1, 0);
  d.meta = typed(&a, 2, 0, napi_float64_array);
  d.cos = array(&a, 3, 0), d.sin = array(&a, 4, 0), d.bias = array(&a, 5, 1);
  d.s = (Heads){(int)number(&a, 6), (int)number(&a, 7), (int)number(&a, 8), (int)number(&a, 9), 0};
  d.out = array(&a, 10, 0);
  if (!a.bad && (d.s.K <= 0 || d.s.H % d.s.K)) fail(&a, "prefab_cpu: query heads must be a multiple of key/value heads");
  if (a.bad || R == 0) return a.bad ? NULL : nothing(env);
  d.s.scale = 1.0f / sqrtf((float)d.s.hd);
  d.width = (d.s.H + 2 * d.s.K) * d.s.hd;
  size_t rope = length_of(&a, 3);
  require(&a, length_of(&a, 1) == (size_t)R * d.width, "prefab_cpu: decodeAttentionRows: qkv is not a row of (H + 2K)·hd a memory");
  require(&a, length_of(&a, 2) >= 4 * (size_t)R, "prefab_cpu: decodeAttentionRows: meta is not four numbers a row");
  require(&a, length_of(&a, 4) == rope, "prefab_cpu: decodeAttentionRows: cos and sin differ in length");
  require(&a, !d.bias || length_of(&a, 5) == (size_t)d.width, "prefab_cpu: decodeAttentionRows: bias is not one row of qkv");
  require(&a, length_of(&a, 10) >= (size_t)R * d.s.H * d.s.hd, "prefab_cpu: decodeAttentionRows: out is not H·hd a row");
  require(&a, d.s.hp >= d.s.hd, "prefab_cpu: decodeAttentionRows: hp under hd");
  if (a.bad) return NULL;
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
    const double *m = d.meta + 4 * r;
    size_t n = (size_t)m[2], last = (size_t)m[1] + (size_t)(d.s.K - 1) * (size_t)m[3] + n * d.s.hp;
    require(&a, m[2] >= 1, "prefab_cpu: decodeAttentionRows: a row with no position to attend to");
    require(&a, n * d.s.hd <= rope, "prefab_cpu: decodeAttentionRows: a position past the rope table");
    require(&a, a.bad || last <= length_of(&one, 0), "prefab_cpu: decodeAttentionRows: a row's keys or values past its memory");
    work += n * d.s.H * d.s.hd;
  }
  if (!a.bad) {
    parallel((int)R, place_rows_share, &d, (size_t)R * d.width < SMALL ? ONE : 0);
    parallel((int)R, attend_rows_share, &d, work < ROWS_ALONE ? ONE : 0);
  }
  free(d.mems);
  return a.bad ? NULL : nothing(env);
}

// Below this many elements swigluRows runs on the calling thread (a step's rows; a prompt's are shared).
enum { SWIGLU_ALONE = 1 << 18 };

typedef struct {
  const float *gateUp;
  float *out;
  int F;
} SwigluRows;

// Eight lanes at a time, the exponential too (docs/experiments.md, "A decoding step's attention").
static void swiglu_rows_share(void *ctx, int from, int to) {
  const SwigluRows *k = ctx;
  int F = k->F;
  for (int r = from; r < to; r++) {
    const float *g = k->gateUp + (size_t)r * 2 * F, *u = g + F;
    float *out = k->out + (size_t)r * F;
    int i = 0;
    for (; i + 8 <= F; i += 8) {
      v8 gv, uv;
      memcpy(&gv, g + i, sizeof gv), memcpy(&uv, u + i, sizeof uv);
      gv = gv / (1.0f + fast_exp8(-gv)) * uv;
      memcpy(out + i, &gv, sizeof gv);
    }
    for (; i < F; i++) out[i] = g[i] * sigmoid(g[i]) * u[i];
  }
}

// swigluRows(gateUp, R, F, out): out (R, F) = silu(gate) ⊙ up for each row of gateUp (R, 2F), its gate then
// its up: a pass's rows in one call.
napi_value js_swiglu_rows(napi_env env, napi_callback_info info) {
  Args a = args_of(env, info);
  SwigluRows k = {.gateUp = array(&a, 0, 0), .out = array(&a, 3, 0)};
  int R = (int)number(&a, 1);
  k.F = (int)number(&a, 2);
  require(&a, length_of(&a, 0) >= 2 * (size_t)R * k.F && length_of(&a, 3) >= (size_t)R * k.F,
          "prefab_cpu: swigluRows: gateUp is not (R, 2F) or out (R, F)");
  if (a.bad) return NULL;
  parallel(R, swiglu_rows_share, &k, (size_t)R * k.F < SWIGLU_ALONE ? ONE : 0);
  return nothing(env);
}

// ---- a decoding step's rows through a weight matrix kept in panels -------------------------------------------

// A weight matrix (n, k) is kept as panels of PANEL rows, each stored column by column (k groups of PANEL
// floats, the last panel padded with zeros), and a step's rows are taken BLOCK at a time, their columns
// interleaved likewise: the product's inner loop then reads two registers of weights and BLOCK of the rows'
// values, and updates 2·BLOCK accumulators that wait on nothing but their own last sum. OpenBLAS's sgemm packs
// the matrix again on every call, which for a few rows costs about as much as the product
// (docs/experiments.md, "A decoding step's products").
enum { PANEL = 16, BLOCK = 6 };

static inline v8 load8(const float *p) {
  v8 v;
  memcpy(&v, p, sizeof v);
  return v;
}

// `rows` (1..BLOCK, a constant where inlined) rows of packed x (k groups of BLOCK) against one panel: y's
// `cols` (PANEL, or fewer at the matrix's end) columns, added to what y holds with `add`.
static inline __attribute__((always_inline)) void panel_block(const float *xb, const float *panel, int k, float *y,
                                                              int ldy, int rows, int cols, int add) {
  v8 c[BLOCK][2] = {{{0}}};
  for (int p = 0; p < k; p++) {
    v8 w0 = load8(panel + PANEL * p), w1 = load8(panel + PANEL * p + 8);
    const float *a = xb + BLOCK * p;
#pragma GCC unroll 6
    for (int i = 0; i < BLOCK; i++)
      if (i < rows) {
        v8 ai = splat(a[i]);
        c[i][0] += ai * w0, c[i][1] += ai * w1;
      }
  }
  for (int i = 0; i < rows; i++) {
    float *yi = y + (size_t)i * ldy;
    if (cols == PANEL) {
      if (add) c[i][0] += load8(yi), c[i][1] += load8(yi + 8);
      memcpy(yi, &c[i][0], sizeof c[i][0]), memcpy(yi + 8, &c[i][1], sizeof c[i][1]);
    } else
      for (int u = 0; u < cols; u++) yi[u] = (add ? yi[u] : 0) + c[i][u / 8][u % 8];
  }
}

typedef struct {
  const float *xp, *panels;
  float *y;
  int m, n, k, add;
} PanelTimes;

static void panel_times_share(void *ctx, int from, int to) {
  const PanelTimes *t = ctx;
  for (int j = from; j < to; j++) {
    const float *panel = t->panels + (size_t)j * PANEL * t->k;
    int cols = t->n - j * PANEL < PANEL ? t->n - j * PANEL : PANEL;
    for (int b = 0; b * BLOCK < t->m; b++) {
      const float *xb = t->xp + (size_t)b * BLOCK * t->k;
      float *y = t->y + (size_t)b * BLOCK * t->n + (size_t)j * PANEL;
      switch (t->m - b * BLOCK < BLOCK ? t->m - b * BLOCK : BLOCK) {
        case 1: panel_block(xb, panel, t->k, y, t->n, 1, cols, t->add); break;
        case 2: panel_block(xb, panel, t->k, y, t->n, 2, cols, t->add); break;
        case 3: panel_block(xb, panel, t->k, y, t->n, 3, cols, t->add); break;
        case 4: panel_block(xb, panel, t->k, y, t->n, 4, cols, t->add); break;
        case 5: panel_block(xb, panel, t->k, y, t->n, 5, cols, t->add); break;
        default: panel_block(xb, panel, t->k, y, t->n, BLOCK, cols, t->add);
      }
    }
  }
}

// packPanels(w, n, k, out): w (n, k) row-major into panels (out: ceil(n / 16)·16·k floats), as panelTimes reads it.
napi_value js_pack_panels(napi_env env, napi_callback_info info) {
  Args a = args_of(env, info);
  const float *w = array(&a, 0, 0);
  int n = (int)number(&a, 1), k = (int)number(&a, 2);
  float *out = array(&a, 3, 0);
  require(&a, length_of(&a, 0) >= (size_t)n * k, "prefab_cpu: packPanels: w is not (n, k)");
  require(&a, length_of(&a, 3) >= (size_t)(n + PANEL - 1) / PANEL * PANEL * k,
          "prefab_cpu: packPanels: out is not ceil(n / 16)·16·k floats");
  if (a.bad) return NULL;
  for (int j0 = 0; j0 < n; j0 += PANEL)
    for (int p = 0; p < k; p++)
      for (int u = 0; u < PANEL; u++) *out++ = j0 + u < n ? w[(size_t)(j0 + u) * k + p] : 0;
  return nothing(env);
}

// panelTimes(x, m, panels, n, k, y, add): y (m, n) = x (m, k) · wᵀ, or y += it with add, for w (n, k) packed by
// packPanels: a decoding step's rows through a layer's weights, the panels shared between the cores where
// the matrix passes 1 MiB (a smaller one is read faster than a thread starts).
napi_value js_panel_times(napi_env env, napi_callback_info info) {
  Args a = args_of(env, info);
  PanelTimes t = {0};
  const float *x = array(&a, 0, 0);
  t.m = (int)number(&a, 1);
  t.panels = array(&a, 2, 0);
  t.n = (int)number(&a, 3), t.k = (int)number(&a, 4);
  t.y = array(&a, 5, 0);
  bool add = false;
  if (a.n < 7 || napi_get_value_bool(env, a.v[6], &add) != napi_ok) fail(&a, "prefab_cpu: panelTimes: expected add, a boolean");
  t.add = add;
  require(&a, length_of(&a, 0) >= (size_t)t.m * t.k, "prefab_cpu: panelTimes: x is not (m, k)");
  require(&a, length_of(&a, 2) >= (size_t)(t.n + PANEL - 1) / PANEL * PANEL * t.k,
          "prefab_cpu: panelTimes: panels are not ceil(n / 16)·16·k floats");
  require(&a, length_of(&a, 5) >= (size_t)t.m * t.n, "prefab_cpu: panelTimes: y is not (m, n)");
  if (a.bad || t.m <= 0 || t.n <= 0) return a.bad ? NULL : nothing(env);
  int blocks = (t.m + BLOCK - 1) / BLOCK;
  float *xp = malloc(sizeof(float) * (size_t)blocks * BLOCK * t.k);
  if (!xp) {
    napi_throw_error(env, NULL, "prefab_cpu: out of memory");
    return NULL;
  }
  // x's rows BLOCK at a time, column by column (the missing rows of the last block are never read).
  for (int i = 0; i < t.m; i++)
    for (int p = 0; p < t.k; p++) xp[((size_t)(i / BLOCK) * t.k + p) * BLOCK + i % BLOCK] = x[(size_t)i * t.k + p];
  t.xp = xp;
  int panels = (t.n + PANEL - 1) / PANEL;
  parallel(panels, panel_times_share, &t, (size_t)t.n * t.k < (1u << 18) ? ONE : 0);
  free(xp);
  return nothing(env);
}
