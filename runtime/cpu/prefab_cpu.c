// The CPU path's kernels in C (a Node-API addon, built at install by node-gyp where a C compiler is found):
// the GEMMs by OpenBLAS's cblas_sgemm, opened at run time (libopenblas.so.0, Debian's libopenblas0), and the
// Llama's other steps as plain loops the compiler vectorises for this machine; decode.c holds the decoder's
// attention. runtime/cpu/kernels.ts loads it; without it the reference model trains on WebAssembly. Each
// kernel is checked against the reference model's operations (test/runtime/cpu/kernels.test.ts).
// Arrays come in as typed array views of the type each kernel reads, checked (prefab_cpu.h typed(); their
// offset is their first element); sizes are numbers.
#include "prefab_cpu.h"
#include <dlfcn.h>
#include <pthread.h>
#include <unistd.h>

enum { ROW_MAJOR = 101, NO_TRANS = 111, TRANS = 112 };
typedef void (*sgemm_fn)(int, int, int, int, int, int, float, const float *, int, const float *, int, float,
                         float *, int);
static sgemm_fn sgemm;
static void (*blas_set_threads)(int);
static int (*blas_get_threads)(void);
static char blas_name[64];

static int has_blas(napi_env env) {
  if (!sgemm) napi_throw_error(env, NULL, "prefab_cpu: no BLAS was found (libopenblas.so.0)");
  return sgemm != NULL;
}

// Runs fn(ctx, from, to) over [0, units) split into one contiguous share a thread (`threads` of them, the
// first on this one), or all on this one with ONE. Shares that call BLAS (WITH_BLAS) have it on one thread
// meanwhile, so that they do not fight its threads for the cores and sum in the same order however many
// shares there are. A thread is started a call: tens of
// microseconds, against the milliseconds of the loops that are shared.
static int threads = 1;

typedef struct {
  share_fn fn;
  void *ctx;
  int from, to;
} Share;

static void *run_share(void *p) {
  Share *s = p;
  s->fn(s->ctx, s->from, s->to);
  return NULL;
}

void parallel(int units, share_fn fn, void *ctx, int mode) {
  int n = mode & ONE ? 1 : threads < units ? threads : units;
  // Even on one share: OpenBLAS's own split of a product could sum it in another order (see js_sgemm).
  int blas = mode & WITH_BLAS && blas_get_threads && blas_set_threads ? blas_get_threads() : 0;
  if (blas > 1) blas_set_threads(1);
  if (n <= 1) {
    if (units > 0) fn(ctx, 0, units);
    if (blas > 1) blas_set_threads(blas);
    return;
  }
  Share shares[MAX_THREADS];
  pthread_t ids[MAX_THREADS];
  int started[MAX_THREADS] = {0};
  for (int i = 0; i < n; i++) shares[i] = (Share){fn, ctx, (int)((long)units * i / n), (int)((long)units * (i + 1) / n)};
  for (int i = 1; i < n; i++) started[i] = pthread_create(&ids[i], NULL, run_share, &shares[i]) == 0;
  for (int i = 0; i < n; i++)
    if (i == 0 || !started[i]) run_share(&shares[i]);
  for (int i = 1; i < n; i++)
    if (started[i]) pthread_join(ids[i], NULL);
  if (blas > 1) blas_set_threads(blas);
}

// ---- GEMM --------------------------------------------------------------------------------------------------

// sgemm(transA, transB, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc): C = alpha·op(A)·op(B) + beta·C, row-major.
static napi_value js_sgemm(napi_env env, napi_callback_info info) {
  Args a = args_of(env, info);
  int ta = (int)number(&a, 0), tb = (int)number(&a, 1);
  int m = (int)number(&a, 2), n = (int)number(&a, 3), k = (int)number(&a, 4);
  float alpha = (float)number(&a, 5);
  const float *A = array(&a, 6, 0);
  int lda = (int)number(&a, 7);
  const float *B = array(&a, 8, 0);
  int ldb = (int)number(&a, 9);
  float beta = (float)number(&a, 10);
  float *C = array(&a, 11, 0);
  int ldc = (int)number(&a, 12);
  if (a.bad || !has_blas(env)) return NULL;
  // A small product (a decoding step's rows) on one thread: waking OpenBLAS's sleeping second thread costs
  // more than it saves there (docs/experiments.md, "On the C kernels"); unless B passes 1 MiB, a layer's
  // weights read from memory rather than a cache, which two cores read faster.
  int before = blas_get_threads && blas_set_threads ? blas_get_threads() : 1;
  size_t weights = sizeof(float) * (size_t)(tb ? n : k) * (size_t)ldb;
  int one = before > 1 && (double)m * n * k < 12e6 && weights < (1u << 20);
  if (one) blas_set_threads(1);
  sgemm(ROW_MAJOR, ta ? TRANS : NO_TRANS, tb ? TRANS : NO_TRANS, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
  if (one) blas_set_threads(before);
  return nothing(env);
}

// ---- RMSNorm, RoPE, SwiGLU ------------------------------------------------------------------------------------


typedef struct {
  const float *x, *r, *w, *rstd, *dy, *dxin, *cs, *sn, *g, *u, *dm;
  float *s, *y, *rstdw, *dx, *dw, *out, *m, *dg, *du;
  int rows, dim, length, heads, hd;
  size_t n;
  float eps, sign;
} Rows;

static void rmsnorm_forward_share(void *ctx, int from, int to) {
  Rows *k = ctx;
  int dim = k->dim;
  for (int i = from; i < to; i++) {
    const float *xi = k->x + (size_t)i * dim;
    if (k->r) {
      const float *ri = k->r + (size_t)i * dim;
      float *si = k->s + (size_t)i * dim;
      for (int j = 0; j < dim; j++) si[j] = xi[j] + ri[j];
      xi = si;
    }
    // The squares summed in eight lanes (vectorized): one running sum waits on each addition before the next.
    float sum = 0, lane[8] __attribute__((aligned(32))) = {0};
    int j = 0;
    for (; j + 8 <= dim; j += 8)
      for (int u = 0; u < 8; u++) lane[u] += xi[j + u] * xi[j + u];
    for (; j < dim; j++) sum += xi[j] * xi[j];
    sum += ((lane[0] + lane[4]) + (lane[2] + lane[6])) + ((lane[1] + lane[5]) + (lane[3] + lane[7]));
    float rs = 1.0f / sqrtf(sum / dim + k->eps);
    k->rstdw[i] = rs;
    float *yi = k->y + (size_t)i * dim;
    for (int j = 0; j < dim; j++) yi[j] = xi[j] * rs * k->w[j];
  }
}

// rmsnormForward(x, r|null, s|null, w, y, rstd, rows, dim, eps): s = x + r when r is given (the residual
// stream), then y = s·rstd·w with rstd = 1/sqrt(mean(s²) + eps) per row.
static napi_value js_rmsnorm_forward(napi_env env, napi_callback_info info) {
  Args a = args_of(env, info);
  Rows k = {.x = array(&a, 0, 0), .r = array(&a, 1, 1), .s = array(&a, 2, 1), .w = array(&a, 3, 0)};
  k.y = array(&a, 4, 0), k.rstdw = array(&a, 5, 0);
  k.rows = (int)number(&a, 6), k.dim = (int)number(&a, 7), k.eps = (float)number(&a, 8);
  if (!a.bad && k.r && !k.s) fail(&a, "prefab_cpu: a residual needs its sum's array");
  if (a.bad) return NULL;
  parallel(k.rows, rmsnorm_forward_share, &k, SHARES((size_t)k.rows * k.dim));
  return nothing(env);
}

// dx of rows [from, to).
static void rmsnorm_dx_share(void *ctx, int from, int to) {
  Rows *k = ctx;
  int dim = k->dim;
  const float *w = k->w;
  for (int i = from; i < to; i++) {
    const float *xi = k->x + (size_t)i * dim, *dyi = k->dy + (size_t)i * dim;
    float *dxi = k->dx + (size_t)i * dim;
    float rs = k->rstd[i], dot = 0;
    for (int j = 0; j < dim; j++) dot += dyi[j] * w[j] * xi[j] * rs;
    float mean = dot / dim;
    if (k->dxin) {
      const float *di = k->dxin + (size_t)i * dim;
      for (int j = 0; j < dim; j++) dxi[j] = di[j] + rs * (dyi[j] * w[j] - xi[j] * rs * mean);
    } else
      for (int j = 0; j < dim; j++) dxi[j] = rs * (dyi[j] * w[j] - xi[j] * rs * mean);
  }
}

// dw of columns [16·from, 16·to), every row added in order (the same sums whatever the shares).
static void rmsnorm_dw_share(void *ctx, int from, int to) {
  Rows *k = ctx;
  int lo = 16 * from, hi = 16 * to < k->dim ? 16 * to : k->dim;
  for (int i = 0; i < k->rows; i++) {
    const float *xi = k->x + (size_t)i * k->dim, *dyi = k->dy + (size_t)i * k->dim;
    float rs = k->rstd[i];
    for (int j = lo; j < hi; j++) k->dw[j] += dyi[j] * xi[j] * rs;
  }
}

// rmsnormBackward(x, w, rstd, dy, dxIn|null, dx, dw|null, rows, dim): with x̂ = x·rstd,
// dx = rstd·(dy·w − x̂·mean(dy·w·x̂)) (+ dxIn), dw += Σ_rows dy·x̂.
static napi_value js_rmsnorm_backward(napi_env env, napi_callback_info info) {
  Args a = args_of(env, info);
  Rows k = {.x = array(&a, 0, 0), .w = array(&a, 1, 0), .rstd = array(&a, 2, 0), .dy = array(&a, 3, 0)};
  k.dxin = array(&a, 4, 1), k.dx = array(&a, 5, 0), k.dw = array(&a, 6, 1);
  k.rows = (int)number(&a, 7), k.dim = (int)number(&a, 8);
  if (a.bad) return NULL;
  int small = SHARES((size_t)k.rows * k.dim);
  parallel(k.rows, rmsnorm_dx_share, &k, small);
  if (k.dw) parallel((k.dim + 15) / 16, rmsnorm_dw_share, &k, small);
  return nothing(env);
}

static void rope_share(void *ctx, int from, int to) {
  Rows *k = ctx;
  int hd = k->hd, half = hd / 2;
  for (int r = from; r < to; r++) {
    const float *c = k->cs + (size_t)(r % k->length) * hd, *s = k->sn + (size_t)(r % k->length) * hd;
    for (int h = 0; h < k->heads; h++) {
      const float *xi = k->x + ((size_t)r * k->heads + h) * hd;
      float *oi = k->out + ((size_t)r * k->heads + h) * hd;
      for (int j = 0; j < half; j++) {
        float x1 = xi[j], x2 = xi[j + half], sj = k->sign * s[j];
        oi[j] = x1 * c[j] - x2 * sj;
        oi[j + half] = x2 * c[j] + x1 * sj;
      }
    }
  }
}

// rope(x, cos, sin, out, rows, length, heads, hd, sign): rotate-half RoPE of x (rows, heads, hd), row r at
// position r mod length, by the model's tables (positions, hd); sign −1 turns back (the backward).
static napi_value js_rope(napi_env env, napi_callback_info info) {
  Args a = args_of(env, info);
  Rows k = {.x = array(&a, 0, 0), .cs = array(&a, 1, 0), .sn = array(&a, 2, 0), .out = array(&a, 3, 0)};
  k.rows = (int)number(&a, 4), k.length = (int)number(&a, 5), k.heads = (int)number(&a, 6), k.hd = (int)number(&a, 7);
  k.sign = (float)number(&a, 8);
  if (a.bad) return NULL;
  parallel(k.rows, rope_share, &k, SHARES((size_t)k.rows * k.heads * k.hd));
  return nothing(env);
}

#define CHUNKS(n) ((int)(((n) + CHUNK - 1) / CHUNK))
#define CHUNK_RANGE(n)                                                                                            \
  size_t lo = (size_t)from * CHUNK, hi = (size_t)to * CHUNK;                                                     \
  if (hi > (n)) hi = (n)

static void swiglu_forward_share(void *ctx, int from, int to) {
  Rows *k = ctx;
  CHUNK_RANGE(k->n);
  for (size_t i = lo; i < hi; i++) k->m[i] = k->g[i] * sigmoid(k->g[i]) * k->u[i];
}

// swigluForward(g, u, m, n): m = g·σ(g)·u.
static napi_value js_swiglu_forward(napi_env env, napi_callback_info info) {
  Args a = args_of(env, info);
  Rows k = {.g = array(&a, 0, 0), .u = array(&a, 1, 0), .m = array(&a, 2, 0), .n = (size_t)number(&a, 3)};
  if (a.bad) return NULL;
  parallel(CHUNKS(k.n), swiglu_forward_share, &k, SHARES(k.n));
  return nothing(env);
}

static void swiglu_backward_share(void *ctx, int from, int to) {
  Rows *k = ctx;
  CHUNK_RANGE(k->n);
  for (size_t i = lo; i < hi; i++) {
    float g = k->g[i], s = sigmoid(g), d = k->dm[i];
    k->du[i] = d * g * s;
    k->dg[i] = d * k->u[i] * s * (1.0f + g * (1.0f - s));
  }
}

// swigluBackward(g, u, dm, dg, du, n): du = dm·g·σ(g), dg = dm·u·σ(g)·(1 + g·(1 − σ(g))). dg may be dm.
static napi_value js_swiglu_backward(napi_env env, napi_callback_info info) {
  Args a = args_of(env, info);
  Rows k = {.g = array(&a, 0, 0), .u = array(&a, 1, 0), .dm = array(&a, 2, 0), .dg = array(&a, 3, 0)};
  k.du = array(&a, 4, 0), k.n = (size_t)number(&a, 5);
  if (a.bad) return NULL;
  parallel(CHUNKS(k.n), swiglu_backward_share, &k, SHARES(k.n));
  return nothing(env);
}

// ---- attention -------------------------------------------------------------------------------------------------

typedef struct {
  int B, T, H, K, hd, G;
  float scale;
} Heads;

static Heads heads_of(Args *a, size_t i) {
  Heads s = {(int)number(a, i), (int)number(a, i + 1), (int)number(a, i + 2), (int)number(a, i + 3),
             (int)number(a, i + 4), 1, 0};
  if (!a->bad && (s.K <= 0 || s.H % s.K)) fail(a, "prefab_cpu: query heads must be a multiple of key/value heads");
  if (!a->bad) s.G = s.H / s.K, s.scale = 1.0f / sqrtf((float)s.hd);
  return s;
}

// attentionForward(q, k, v, p, out, B, T, H, K, hd): causal softmax attention, query head h reading key/value
// head h/G; q, out (B, T, H, hd), k, v (B, T, K, hd); p (B, H, T, T) kept for the backward (zero above the
// diagonal within each block of rows; the columns past a block's last row are not written, nor read). Each head's products are GEMMs over strided rows.
typedef struct {
  Heads s;
  const float *q, *k, *v, *p, *dout;
  float *pw, *out, *dq, *dk, *dv;
} Attention;

// Query rows go a block at a time, each block's products over the keys up to its last row only: the causal
// half of the work is skipped but for the blocks on the diagonal. 64 rows: the fastest block of those measured (docs/experiments.md).
enum { ATTENTION_BLOCK = 64 };

// Softmax of P's rows [r0, r1) over their keys up to each row (the row's scores in, its probabilities out),
// zero up to the block's last key c.
static void causal_softmax(float *p, int T, int r0, int r1) {
  for (int t = r0; t < r1; t++) {
    float *row = p + (size_t)t * T, max = row[0], sum = 0;
    for (int j = 1; j <= t; j++) max = row[j] > max ? row[j] : max;
    for (int j = 0; j <= t; j++) sum += (row[j] = fast_exp(row[j] - max));
    float inv = 1.0f / sum;
    for (int j = 0; j <= t; j++) row[j] *= inv;
    memset(row + t + 1, 0, sizeof(float) * (r1 - t - 1));
  }
}

// One share of the forward: the query heads of key/value heads [from, to) of (B·K).
static void attention_forward_share(void *ctx, int from, int to) {
  Attention *a = ctx;
  Heads s = a->s;
  int T = s.T, hd = s.hd, qs = s.H * hd, ks = s.K * hd;
  for (int unit = from; unit < to; unit++)
    for (int g = 0; g < s.G; g++) {
      int b = unit / s.K, h = (unit % s.K) * s.G + g;
      const float *qh = a->q + (size_t)b * T * qs + h * hd;
      const float *kh = a->k + (size_t)b * T * ks + (h / s.G) * hd, *vh = a->v + (size_t)b * T * ks + (h / s.G) * hd;
      float *ph = a->pw + ((size_t)b * s.H + h) * T * T, *oh = a->out + (size_t)b * T * qs + h * hd;
      for (int r0 = 0; r0 < T; r0 += ATTENTION_BLOCK) {
        int r1 = r0 + ATTENTION_BLOCK < T ? r0 + ATTENTION_BLOCK : T, rows = r1 - r0;
        float *pb = ph + (size_t)r0 * T;
        sgemm(ROW_MAJOR, NO_TRANS, TRANS, rows, r1, hd, s.scale, qh + (size_t)r0 * qs, qs, kh, ks, 0.0f, pb, T);
        causal_softmax(ph, T, r0, r1);
        sgemm(ROW_MAJOR, NO_TRANS, NO_TRANS, rows, hd, r1, 1.0f, pb, T, vh, ks, 0.0f, oh + (size_t)r0 * qs, qs);
      }
    }
}

static napi_value js_attention_forward(napi_env env, napi_callback_info info) {
  Args a = args_of(env, info);
  Attention at = {0};
  at.q = array(&a, 0, 0), at.k = array(&a, 1, 0), at.v = array(&a, 2, 0);
  at.pw = array(&a, 3, 0), at.out = array(&a, 4, 0);
  at.s = heads_of(&a, 5);
  if (a.bad || !has_blas(env)) return NULL;
  parallel(at.s.B * at.s.K, attention_forward_share, &at, WITH_BLAS);
  return nothing(env);
}

// One share of the backward: key/value heads [from, to) of (B·K) with their query heads (dk and dv are
// sums over those, over every query block), a block's dP made in a scratch of the share's own.
static void attention_backward_share(void *ctx, int from, int to) {
  Attention *a = ctx;
  Heads s = a->s;
  int T = s.T, hd = s.hd, qs = s.H * hd, ks = s.K * hd;
  float *ds = malloc(sizeof(float) * ATTENTION_BLOCK * T);
  if (!ds) abort();
  for (int unit = from; unit < to; unit++) {
    int b = unit / s.K, kv = unit % s.K;
    size_t ko = (size_t)b * T * ks + kv * hd;
    for (int t = 0; t < T; t++) {
      memset(a->dk + ko + (size_t)t * ks, 0, sizeof(float) * hd);
      memset(a->dv + ko + (size_t)t * ks, 0, sizeof(float) * hd);
    }
    for (int g = 0; g < s.G; g++) {
      int h = kv * s.G + g;
      size_t qo = (size_t)b * T * qs + h * hd;
      const float *ph = a->p + ((size_t)b * s.H + h) * T * T;
      for (int r0 = 0; r0 < T; r0 += ATTENTION_BLOCK) {
        int r1 = r0 + ATTENTION_BLOCK < T ? r0 + ATTENTION_BLOCK : T, rows = r1 - r0;
        const float *pb = ph + (size_t)r0 * T, *dout = a->dout + qo + (size_t)r0 * qs, *q = a->q + qo + (size_t)r0 * qs;
        sgemm(ROW_MAJOR, TRANS, NO_TRANS, r1, hd, rows, 1.0f, pb, T, dout, qs, 1.0f, a->dv + ko, ks);
        sgemm(ROW_MAJOR, NO_TRANS, TRANS, rows, r1, hd, 1.0f, dout, qs, a->v + ko, ks, 0.0f, ds, T);
        for (int t = r0; t < r1; t++) {
          const float *pr = ph + (size_t)t * T;
          float *dr = ds + (size_t)(t - r0) * T, dot = 0;
          for (int j = 0; j <= t; j++) dot += dr[j] * pr[j];
          for (int j = 0; j <= t; j++) dr[j] = pr[j] * (dr[j] - dot) * s.scale;
          memset(dr + t + 1, 0, sizeof(float) * (r1 - t - 1));
        }
        sgemm(ROW_MAJOR, NO_TRANS, NO_TRANS, rows, hd, r1, 1.0f, ds, T, a->k + ko, ks, 0.0f, a->dq + qo + (size_t)r0 * qs, qs);
        sgemm(ROW_MAJOR, TRANS, NO_TRANS, r1, hd, rows, 1.0f, ds, T, q, qs, 1.0f, a->dk + ko, ks);
      }
    }
  }
  free(ds);
}

// attentionBackward(q, k, v, p, dout, dq, dk, dv, B, T, H, K, hd): dv = Σ_G Pᵀ·dout, dP = dout·vᵀ,
// dS = P ⊙ (dP − rowsum(dP ⊙ P))·scale, dq = dS·k, dk = Σ_G dSᵀ·q.
static napi_value js_attention_backward(napi_env env, napi_callback_info info) {
  Args a = args_of(env, info);
  Attention at = {0};
  at.q = array(&a, 0, 0), at.k = array(&a, 1, 0), at.v = array(&a, 2, 0), at.p = array(&a, 3, 0);
  at.dout = array(&a, 4, 0);
  at.dq = array(&a, 5, 0), at.dk = array(&a, 6, 0), at.dv = array(&a, 7, 0);
  at.s = heads_of(&a, 8);
  if (a.bad || !has_blas(env)) return NULL;
  parallel(at.s.B * at.s.K, attention_backward_share, &at, WITH_BLAS);
  return nothing(env);
}

// ---- the head's log-probs --------------------------------------------------------------------------------------

typedef struct {
  float *z, *logp, *lse, *entropy;
  const float *lsein, *dlogp;
  const int *targets;
  int V;
} Head;

// A target outside the vocabulary would be read (and written) outside the logits: refused, as the graph does.
static void check_targets(Args *a, const int *targets, int rows, int V) {
  for (int i = 0; i < rows; i++)
    if (targets[i] < 0 || targets[i] >= V) {
      fail(a, "prefab_cpu: a target token id is outside the vocabulary");
      return;
    }
}

static void logprobs_forward_share(void *ctx, int from, int to) {
  Head *k = ctx;
  int V = k->V;
  for (int i = from; i < to; i++) {
    const float *zi = k->z + (size_t)i * V;
    float max = zi[0], sum = 0, weighted = 0;
    for (int j = 1; j < V; j++) max = zi[j] > max ? zi[j] : max;
    for (int j = 0; j < V; j++) {
      float e = fast_exp(zi[j] - max);
      sum += e;
      weighted += e * zi[j];
    }
    float l = max + logf(sum);
    k->lse[i] = l;
    k->logp[i] = zi[k->targets[i]] - l;
    if (k->entropy) k->entropy[i] = l - weighted / sum;
  }
}

// logprobsForward(z, targets, logp, lse, entropy|null, rows, V): from logits z (rows, V), lse = logsumexp(z),
// logp = z[target] − lse, and entropy = lse − Σ softmax(z)·z when asked.
static napi_value js_logprobs_forward(napi_env env, napi_callback_info info) {
  Args a = args_of(env, info);
  Head k = {.z = array(&a, 0, 0), .targets = typed(&a, 1, 0, napi_int32_array), .logp = array(&a, 2, 0), .lse = array(&a, 3, 0)};
  k.entropy = array(&a, 4, 1);
  int rows = (int)number(&a, 5);
  k.V = (int)number(&a, 6);
  if (!a.bad) check_targets(&a, k.targets, rows, k.V);
  if (a.bad) return NULL;
  parallel(rows, logprobs_forward_share, &k, SHARES((size_t)rows * k.V));
  return nothing(env);
}

static void logprobs_backward_share(void *ctx, int from, int to) {
  Head *k = ctx;
  int V = k->V;
  for (int i = from; i < to; i++) {
    float *zi = k->z + (size_t)i * V, l = k->lsein[i], d = k->dlogp[i];
    for (int j = 0; j < V; j++) zi[j] = -d * fast_exp(zi[j] - l);
    zi[k->targets[i]] += d;
  }
}

// logprobsBackward(z, targets, lse, dlogp, rows, V): z becomes dz = dlogp·(onehot(target) − softmax(z)).
static napi_value js_logprobs_backward(napi_env env, napi_callback_info info) {
  Args a = args_of(env, info);
  Head k = {.z = array(&a, 0, 0), .targets = typed(&a, 1, 0, napi_int32_array), .lsein = array(&a, 2, 0), .dlogp = array(&a, 3, 0)};
  int rows = (int)number(&a, 4);
  k.V = (int)number(&a, 5);
  if (!a.bad) check_targets(&a, k.targets, rows, k.V);
  if (a.bad) return NULL;
  parallel(rows, logprobs_backward_share, &k, SHARES((size_t)rows * k.V));
  return nothing(env);
}

// ---- the optimizer ---------------------------------------------------------------------------------------------

typedef struct {
  float *p, *m, *v;
  const float *g;
  size_t n;
  double lr, b1, b2, eps, decay, c1, c2, factor;
  double *sums;
} Update;

static void adamw_share(void *ctx, int from, int to) {
  Update *k = ctx;
  CHUNK_RANGE(k->n);
  for (size_t i = lo; i < hi; i++) {
    double gi = k->g[i], mi = k->m[i] * k->b1 + gi * (1 - k->b1), vi = k->v[i] * k->b2 + gi * gi * (1 - k->b2);
    k->m[i] = (float)mi, k->v[i] = (float)vi;
    k->p[i] = (float)(k->p[i] * k->decay - (mi / k->c1 / (sqrt(vi / k->c2) + k->eps)) * k->lr);
  }
}

// adamw(p, g, m, v, n, lr, beta1, beta2, eps, decay, c1, c2): torch.optim.AdamW's update of n values in doubles
// as trainers/optimizer.ts's AdamW, `decay` the factor 1 − lr·weight_decay (1: none), c1 and c2 the bias corrections.
static napi_value js_adamw(napi_env env, napi_callback_info info) {
  Args a = args_of(env, info);
  Update k = {.p = array(&a, 0, 0), .g = array(&a, 1, 0), .m = array(&a, 2, 0), .v = array(&a, 3, 0)};
  k.n = (size_t)number(&a, 4), k.lr = number(&a, 5), k.b1 = number(&a, 6), k.b2 = number(&a, 7);
  k.eps = number(&a, 8), k.decay = number(&a, 9), k.c1 = number(&a, 10), k.c2 = number(&a, 11);
  if (a.bad) return NULL;
  parallel(CHUNKS(k.n), adamw_share, &k, SHARES(k.n));
  return nothing(env);
}

// Each chunk's Σ x² in double, in order.
static void sum_squares_share(void *ctx, int from, int to) {
  Update *k = ctx;
  for (int c = from; c < to; c++) {
    size_t lo = (size_t)c * CHUNK, hi = lo + CHUNK < k->n ? lo + CHUNK : k->n;
    double sum = 0;
    for (size_t i = lo; i < hi; i++) sum += (double)k->g[i] * k->g[i];
    k->sums[c] = sum;
  }
}

// sumSquares(x, n) → Σ x² in double: chunk by chunk, the chunks' sums added in order, so the same whatever the
// threads.
static napi_value js_sum_squares(napi_env env, napi_callback_info info) {
  Args a = args_of(env, info);
  Update k = {.g = array(&a, 0, 0), .n = (size_t)number(&a, 1)};
  if (a.bad) return NULL;
  int chunks = CHUNKS(k.n);
  k.sums = malloc(sizeof(double) * (chunks > 0 ? chunks : 1));
  if (!k.sums) {
    napi_throw_error(env, NULL, "prefab_cpu: out of memory");
    return NULL;
  }
  parallel(chunks, sum_squares_share, &k, SHARES(k.n));
  double sum = 0;
  for (int c = 0; c < chunks; c++) sum += k.sums[c];
  free(k.sums);
  napi_value out;
  napi_create_double(env, sum, &out);
  return out;
}

static void scale_share(void *ctx, int from, int to) {
  Update *k = ctx;
  CHUNK_RANGE(k->n);
  float f = (float)k->factor;
  for (size_t i = lo; i < hi; i++) k->p[i] *= f;
}

// scale(x, n, factor): x *= factor.
static napi_value js_scale(napi_env env, napi_callback_info info) {
  Args a = args_of(env, info);
  Update k = {.p = array(&a, 0, 0), .n = (size_t)number(&a, 1), .factor = number(&a, 2)};
  if (a.bad) return NULL;
  parallel(CHUNKS(k.n), scale_share, &k, SHARES(k.n));
  return nothing(env);
}

// setThreads(n): the threads of every kernel here and of OpenBLAS.
static napi_value js_set_threads(napi_env env, napi_callback_info info) {
  Args a = args_of(env, info);
  int n = (int)number(&a, 0);
  if (a.bad) return NULL;
  threads = n < 1 ? 1 : n > MAX_THREADS ? MAX_THREADS : n;
  if (blas_set_threads) blas_set_threads(threads);
  return nothing(env);
}

// ---- the module ------------------------------------------------------------------------------------------------

// OpenBLAS's threads spin for a while after each call before they sleep (OPENBLAS_THREAD_TIMEOUT): the
// kernels' own threads would share a core with a spinning one. Set shorter unless the user set it.
static void open_blas(void) {
  setenv("OPENBLAS_THREAD_TIMEOUT", "4", 0);
  const char *names[] = {"libopenblas.so.0", "libopenblas.so", "libopenblas.dylib", NULL};
  for (int i = 0; names[i] && !sgemm; i++) {
    void *lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (!lib) continue;
    sgemm = (sgemm_fn)dlsym(lib, "cblas_sgemm");
    blas_set_threads = (void (*)(int))dlsym(lib, "openblas_set_num_threads");
    blas_get_threads = (int (*)(void))dlsym(lib, "openblas_get_num_threads");
    if (sgemm) strncpy(blas_name, names[i], sizeof blas_name - 1);
  }
}

static napi_value init(napi_env env, napi_value exports) {
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  threads = cores < 1 ? 1 : cores > MAX_THREADS ? MAX_THREADS : (int)cores;
  open_blas();
  struct {
    const char *name;
    napi_callback fn;
  } fns[] = {{"sgemm", js_sgemm},
             {"rmsnormForward", js_rmsnorm_forward},
             {"rmsnormBackward", js_rmsnorm_backward},
             {"rope", js_rope},
             {"swigluForward", js_swiglu_forward},
             {"swigluBackward", js_swiglu_backward},
             {"attentionForward", js_attention_forward},
             {"attentionBackward", js_attention_backward},
             {"logprobsForward", js_logprobs_forward},
             {"logprobsBackward", js_logprobs_backward},
             {"adamw", js_adamw},
             {"sumSquares", js_sum_squares},
             {"scale", js_scale},
             {"setThreads", js_set_threads},
             {"swigluRows", js_swiglu_rows},
             {"decodeAttentionRows", js_decode_attention_rows},
             {"packPanels", js_pack_panels},
             {"panelTimes", js_panel_times},
             {"drawRows", js_draw_rows}};
  for (size_t i = 0; i < sizeof fns / sizeof fns[0]; i++) {
    napi_value f;
    napi_create_function(env, fns[i].name, NAPI_AUTO_LENGTH, fns[i].fn, NULL, &f);
    napi_set_named_property(env, exports, fns[i].name, f);
  }
  napi_value blas;
  if (sgemm)
    napi_create_string_utf8(env, blas_name, NAPI_AUTO_LENGTH, &blas);
  else
    napi_get_null(env, &blas);
  napi_set_named_property(env, exports, "blas", blas);
  return exports;
}

NAPI_MODULE(NODE_GYP_MODULE_NAME, init)
