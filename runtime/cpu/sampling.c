// A decoding step's tokens drawn from its rows of logits (drawRows): runtime/sampling.ts sampleToken in C, the
// same algorithm step for step and in the same order of sums, so that a row draws what sampleToken draws from
// it but where exp's last bit differs at a token's boundary. The rows are shared between the cores. Part of
// the addon prefab_cpu.c makes.
#include "prefab_cpu.h"

#include <stdint.h>

// As sampling.ts: buckets of a sixteenth of a halving of the probability, and the nucleus looked for first
// among the probabilities within CUTOFF of the largest.
enum { BUCKETS = 1024 };
static const double CUTOFF = 1e-4;

typedef struct {
  double *probs, *sorted, *mass; // V, V and BUCKETS doubles
  int V;
} Work;

// sampling.ts bucketOf: the double's exponent and first four fraction bits counted down from 1's.
static inline int bucket_of(double p) {
  uint64_t bits;
  memcpy(&bits, &p, sizeof bits);
  int b = 0x3ff0 - (int)(bits >> 48);
  return b < BUCKETS - 1 ? b : BUCKETS - 1;
}

// The id of the k-th token (from 0, in id order) whose probability is p.
static int nth_of(const Work *w, double p, int k) {
  for (int id = 0; id < w->V; id++)
    if (w->probs[id] == p && k-- == 0) return id;
  return 0; // unreachable: p is one of the probabilities
}

static int ascending(const void *x, const void *y) {
  double a = *(const double *)x, b = *(const double *)y;
  return (a > b) - (a < b);
}

static inline double median(double x, double y, double z) {
  double lo = x < y ? x : y, hi = x < y ? y : x;
  return lo > z ? lo : (hi < z ? hi : z);
}

// sampling.ts drawByMass: the token at which the running mass, in order of probability, first reaches r.
static int draw_by_mass(Work *w, double r, int best) {
  if (r <= 0) return best;
  int V = w->V, b = 0;
  double *mass = w->mass, *a = w->sorted;
  memset(mass, 0, sizeof(double) * BUCKETS);
  for (int i = 0; i < V; i++) mass[bucket_of(w->probs[i])] += w->probs[i];
  while (b < BUCKETS - 1 && r > mass[b]) r -= mass[b++];
  if (mass[b] == 0) {
    while (b > 0 && mass[b] == 0) b--;
    r = mass[b];
  }
  int n = 0;
  for (int i = 0; i < V; i++)
    if (bucket_of(w->probs[i]) == b) a[n++] = w->probs[i];
  int lo = 0, hi = n;
  while (hi - lo > 16) {
    double pivot = median(a[lo], a[(lo + hi) / 2], a[hi - 1]), above_mass = 0;
    // [lo, above) > pivot, [above, i) = pivot, [below, hi) < pivot.
    int above = lo, i = lo, below = hi;
    while (i < below) {
      double v = a[i];
      if (v > pivot) a[i++] = a[above], a[above++] = v, above_mass += v;
      else if (v < pivot) a[i] = a[--below], a[below] = v;
      else i++;
    }
    if (r <= above_mass) {
      hi = above;
      continue;
    }
    r -= above_mass;
    int equal = below - above;
    for (int k = 0; k < equal; k++)
      if ((r -= pivot) <= 0 || (below == hi && k == equal - 1)) return nth_of(w, pivot, k);
    lo = below;
  }
  qsort(a + lo, hi - lo, sizeof(double), ascending);
  for (int k = hi - lo - 1; k >= 0; k--) {
    const double *rest = a + lo;
    if ((r -= rest[k]) > 0 && k > 0) continue;
    int before = 0;
    while (k + before + 1 < hi - lo && rest[k + before + 1] == rest[k]) before++;
    return nth_of(w, rest[k], before);
  }
  return best; // unreachable: the bucket holds r's token
}

// sampling.ts sampleToken with its random number u already drawn; -1 where the row has no distribution to draw
// from (NaN or infinite logits, or every one -Infinity), where sampleToken throws.
static int draw_row(Work *w, const float *logits, double temperature, double top_p, double u) {
  int V = w->V, best = 0;
  for (int i = 1; i < V; i++)
    if (logits[i] > logits[best]) best = i;
  if (temperature <= 0) return best;
  double top = logits[best], total = 0, *probs = w->probs;
  for (int i = 0; i < V; i++) total += probs[i] = exp(((double)logits[i] - top) / temperature);
  if (!(total > 0) || !isfinite(total)) return -1;
  if (top_p >= 1) return draw_by_mass(w, u * total, best);
  double *sorted = w->sorted;
  int n = 0;
  for (int i = 0; i < V; i++)
    if (probs[i] >= CUTOFF) sorted[n++] = probs[i];
  qsort(sorted, n, sizeof(double), ascending);
  int size = 0;
  double mass = 0, nucleus = 0;
#define RANKED(k) sorted[n - 1 - (k)]
  for (int pass = 0; pass < 2; pass++) {
    size = 0, mass = 0, nucleus = 0;
    while (size < n) {
      double p = RANKED(size);
      size++, nucleus += p, mass += p / total;
      if (mass >= top_p) break;
    }
    if (mass >= top_p || n == V) break;
    memcpy(sorted, probs, sizeof(double) * V), n = V;
    qsort(sorted, n, sizeof(double), ascending);
  }
  double r = u * nucleus;
  int k = 0;
  while (k < size - 1 && (r -= RANKED(k)) > 0) k++;
  double p = RANKED(k);
  int before = 0;
  while (before < k && RANKED(k - before - 1) == p) before++;
#undef RANKED
  return nth_of(w, p, before);
}

// Below this many logits in all drawRows runs on the calling thread.
enum { DRAW_ALONE = 1 << 16 };

typedef struct {
  float **logits;
  const double *draws;
  int32_t *tokens;
  int V;
  int failed; // set by any share whose workspace could not be allocated (atomically: shares run at once)
} DrawRows;

static void draw_rows_share(void *ctx, int from, int to) {
  DrawRows *d = ctx;
  Work w = {.V = d->V, .probs = malloc(sizeof(double) * ((size_t)2 * d->V + BUCKETS))};
  if (!w.probs) {
    __atomic_store_n(&d->failed, 1, __ATOMIC_RELAXED);
    return;
  }
  w.sorted = w.probs + d->V, w.mass = w.sorted + d->V;
  for (int r = from; r < to; r++) {
    const double *draw = d->draws + 3 * r;
    d->tokens[r] = draw_row(&w, d->logits[r], draw[0], draw[1], draw[2]);
  }
  free(w.probs);
}

// drawRows(logits, draws, tokens): tokens[r] = sampleToken(logits[r], draws[3r], draws[3r + 1]) with its random
// number draws[3r + 2] (in [0, 1)); logits an array of R Float32Arrays of one length V, draws a Float64Array,
// tokens an Int32Array. Throws where a row has no distribution to draw from, as sampleToken does.
napi_value js_draw_rows(napi_env env, napi_callback_info info) {
  Args a = args_of(env, info);
  uint32_t R = 0;
  bool list = false;
  if (a.n < 3 || napi_is_array(env, a.v[0], &list) != napi_ok || !list || napi_get_array_length(env, a.v[0], &R) != napi_ok)
    fail(&a, "prefab_cpu: drawRows: expected an array of logits");
  DrawRows d = {.draws = typed(&a, 1, 0, napi_float64_array), .tokens = typed(&a, 2, 0, napi_int32_array), .V = -1};
  require(&a, length_of(&a, 1) >= 3 * (size_t)R, "prefab_cpu: drawRows: draws are not 3 numbers a row");
  require(&a, length_of(&a, 2) >= R, "prefab_cpu: drawRows: tokens are fewer than the rows");
  if (a.bad) return NULL;
  d.logits = malloc(sizeof(float *) * (R > 0 ? R : 1));
  if (!d.logits) {
    napi_throw_error(env, NULL, "prefab_cpu: out of memory");
    return NULL;
  }
  for (uint32_t r = 0; r < R && !a.bad; r++) {
    napi_value row;
    size_t n = 0;
    void *data = NULL;
    napi_typedarray_type type = napi_int8_array;
    if (napi_get_element(env, a.v[0], r, &row) != napi_ok ||
        napi_get_typedarray_info(env, row, &type, &n, &data, NULL, NULL) != napi_ok || type != napi_float32_array)
      fail(&a, "prefab_cpu: drawRows: a row of logits is not a Float32Array");
    else if (d.V >= 0 && (int)n != d.V)
      fail(&a, "prefab_cpu: drawRows: the rows of logits differ in length");
    else if (n == 0 || n > (size_t)(INT32_MAX / 2 - BUCKETS))
      fail(&a, "prefab_cpu: drawRows: a row of logits is empty, or longer than drawRows takes");
    d.V = (int)n, d.logits[r] = data;
  }
  const char *why = NULL;
  if (!a.bad && R > 0) {
    parallel((int)R, draw_rows_share, &d, (size_t)R * d.V < DRAW_ALONE ? ONE : 0);
    for (uint32_t r = 0; r < R && !d.failed; r++)
      if (d.tokens[r] < 0)
        why = "prefab_cpu: drawRows: a row's logits give no distribution to draw from (NaN, infinite, or all -Infinity)";
    if (d.failed) why = "prefab_cpu: out of memory";
  }
  free(d.logits);
  if (why) napi_throw_error(env, NULL, why);
  return a.bad || why ? NULL : nothing(env);
}
