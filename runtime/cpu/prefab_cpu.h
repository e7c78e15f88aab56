// What the CPU path's C files share (prefab_cpu.c: the training kernels, the threads and the module;
// decode.c: the decoder's attention over its caches, its SwiGLU and its few-row products; sampling.c: a
// step's tokens drawn): reading a call's arguments, a vectorisable exp, and the threads a loop is shared between.
#ifndef PREFAB_CPU_H
#define PREFAB_CPU_H
#include <dlfcn.h>
#include <pthread.h>
#include <unistd.h>
#include <math.h>
#include <node_api.h>
#include <stdlib.h>
#include <string.h>

// ---- arguments -------------------------------------------------------------------------------------------

#define MAX_ARGS 16
typedef struct {
  napi_env env;
  napi_value v[MAX_ARGS];
  size_t n;
  int bad;
} Args;

static inline Args args_of(napi_env env, napi_callback_info info) {
  Args a = {env, {0}, MAX_ARGS, 0};
  napi_get_cb_info(env, info, &a.n, a.v, NULL, NULL);
  return a;
}

static inline void fail(Args *a, const char *why) {
  if (!a->bad) napi_throw_type_error(a->env, NULL, why);
  a->bad = 1;
}

// Argument i's first element, a typed array of `want` (a Float32Array, Int32Array or Float64Array), or NULL
// for null/undefined when `optional`. Another type is refused: its elements are not the size the kernel reads.
static inline void *typed(Args *a, size_t i, int optional, napi_typedarray_type want) {
  napi_valuetype t;
  if (i >= a->n || napi_typeof(a->env, a->v[i], &t) != napi_ok || t == napi_null || t == napi_undefined) {
    if (!optional) fail(a, "prefab_cpu: a required array is missing");
    return NULL;
  }
  void *data = NULL;
  size_t length;
  napi_typedarray_type type;
  if (napi_get_typedarray_info(a->env, a->v[i], &type, &length, &data, NULL, NULL) != napi_ok || type != want) {
    fail(a, want == napi_int32_array     ? "prefab_cpu: expected an Int32Array"
            : want == napi_float64_array ? "prefab_cpu: expected a Float64Array"
                                         : "prefab_cpu: expected a Float32Array");
    return NULL;
  }
  return data;
}

// A Float32Array argument's first element (typed).
static inline void *array(Args *a, size_t i, int optional) { return typed(a, i, optional, napi_float32_array); }

static inline double number(Args *a, size_t i) {
  double x = 0;
  if (i >= a->n || napi_get_value_double(a->env, a->v[i], &x) != napi_ok) fail(a, "prefab_cpu: expected a number");
  return x;
}

// The elements of argument i, a typed array (0 when it is not one).
static inline size_t length_of(Args *a, size_t i) {
  size_t n = 0;
  if (i >= a->n || napi_get_typedarray_info(a->env, a->v[i], NULL, &n, NULL, NULL, NULL) != napi_ok) return 0;
  return n;
}

// Throws `why` unless `ok` (once: a call already failed keeps its first error).
static inline void require(Args *a, int ok, const char *why) {
  if (!ok) fail(a, why);
}

static inline napi_value nothing(napi_env env) {
  napi_value u;
  napi_get_undefined(env, &u);
  return u;
}

// exp(x) in float for a loop the compiler vectorises: 2^n · e^r with |r| ≤ ln2/2, e^r by its degree-6
// Taylor polynomial (relative error under 2e-7 on that range), 2^n put in the exponent's bits.
static inline float fast_exp(float x) {
  x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
  float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f; // rounded to an integer: 1.5·2²³ drops the fraction
  float r = x - n * 0.693145751953125f - n * 1.428606765330187e-06f;
  float p = 1.0f + r * (1.0f + r * (0.5f + r * (1.6666667e-1f + r * (4.1666668e-2f + r * (8.3333338e-3f + r * 1.3888889e-3f)))));
  union {
    float f;
    int i;
  } s = {.i = ((int)n + 127) << 23};
  return p * s.f;
}

static inline float sigmoid(float x) { return 1.0f / (1.0f + fast_exp(-x)); }

// Runs fn(ctx, from, to) over [0, units) in one contiguous share a thread (prefab_cpu.c).
enum { ONE = 1, WITH_BLAS = 2, MAX_THREADS = 64 };
typedef void (*share_fn)(void *ctx, int from, int to);
void parallel(int units, share_fn fn, void *ctx, int mode);

// Element-wise loops run in shares of rows (or of CHUNK elements) once they are large enough to pay for a thread.
enum { CHUNK = 16384, SMALL = 32768 };
#define SHARES(work) ((work) < SMALL ? ONE : 0)

// decode.c's functions, which the module (prefab_cpu.c) exports.
napi_value js_swiglu_rows(napi_env env, napi_callback_info info);
napi_value js_decode_attention_rows(napi_env env, napi_callback_info info);
napi_value js_pack_panels(napi_env env, napi_callback_info info);
napi_value js_panel_times(napi_env env, napi_callback_info info);
// sampling.c's.
napi_value js_draw_rows(napi_env env, napi_callback_info info);
#endif
