/*
** backend.c — the registry of backends and the small facts every backend shares (op names,
** weight sizes). Each backend's table and context live in its own folder: kernels/cpu-ref/,
** kernels/cpu/, kernels/cuda/ (HIP from the same source), kernels/devemu/ (debugging only).
*/
#include "kernels/backend.h"

#include <string.h>

static const char *const op_names[ST_OP_COUNT] = {
#define ST_OP_NAME(id, name) name,
  ST_BACKEND_OPS(ST_OP_NAME)
#undef ST_OP_NAME
};

const char *st_op_name(st_op op) { return op >= 0 && op < ST_OP_COUNT ? op_names[op] : "?"; }

const char *st_wtype_name(st_wtype t) {
  switch (t) {
  case ST_W_F32: return "f32";
  case ST_W_BF16: return "bf16";
  case ST_W_F16: return "f16";
  case ST_W_FP8_E4M3: return "fp8_e4m3";
  case ST_W_FP4_E2M1: return "fp4_e2m1";
  case ST_W_TYPE_COUNT: break;
  }
  return "?";
}

size_t st_weight_data_bytes(const st_weight *w) {
  size_t n = (size_t)w->rows * (size_t)w->cols;
  switch (w->dtype) {
  case ST_W_F32: return 4 * n;
  case ST_W_BF16: case ST_W_F16: return 2 * n;
  case ST_W_FP8_E4M3: return n;
  case ST_W_FP4_E2M1: return n / 2;
  case ST_W_TYPE_COUNT: break;
  }
  return 0;
}

size_t st_weight_scale_bytes(const st_weight *w) {
  if (w->scale_dtype == ST_WSCALE_NONE) return 0;
  size_t n = (size_t)((w->rows + w->block[0] - 1) / w->block[0]) *
             (size_t)((w->cols + w->block[1] - 1) / w->block[1]);
  return n * (w->scale_dtype == ST_WSCALE_F32 ? 4 : w->scale_dtype == ST_WSCALE_BF16 ? 2 : 1);
}

/* Each backend's constructor (its own folder). */
st_status st_backend_cpu_ref_open(st_backend *out);
st_status st_backend_cpu_open(st_backend *out);
#ifdef ST_WITH_DEVEMU
st_status st_backend_devemu_open(st_backend *out);
#endif
#ifdef ST_WITH_CUDA
st_status st_backend_cuda_open(st_backend *out);
#endif
#ifdef ST_WITH_HIP
st_status st_backend_hip_open(st_backend *out);
#endif

const char *st_backend_names(void) { return "cpu-ref|cpu|cuda|hip"; }

st_status st_backend_open(const char *name, st_backend *out) {
  memset(out, 0, sizeof *out);
  if (!name) name = ST_BACKEND_DEFAULT;
  if (!strcmp(name, "cpu-ref")) return st_backend_cpu_ref_open(out);
  if (!strcmp(name, "cpu")) return st_backend_cpu_open(out);
  if (!strcmp(name, ST_BACKEND_DEVEMU)) {
#ifdef ST_WITH_DEVEMU
    return st_backend_devemu_open(out);
#else
    return st_fail(ST_EUNSUPPORTED, "backend %s needs mmap and mprotect (POSIX): not built into this "
                   "binary", ST_BACKEND_DEVEMU);
#endif
  }
  if (!strcmp(name, "cuda")) {
#ifdef ST_WITH_CUDA
    return st_backend_cuda_open(out);
#else
    return st_fail(ST_EUNSUPPORTED, "backend cuda is not built into this binary (configure with "
                   "-DST_WITH_CUDA=ON on a machine with the CUDA toolkit)");
#endif
  }
  if (!strcmp(name, "hip")) {
#ifdef ST_WITH_HIP
    return st_backend_hip_open(out);
#else
    return st_fail(ST_EUNSUPPORTED, "backend hip is not built into this binary (configure with "
                   "-DST_WITH_HIP=ON on a machine with ROCm)");
#endif
  }
  return st_fail(ST_EINVAL, "unknown backend '%s' (known: %s; for debugging the engine's device "
                 "path also %s)", name, st_backend_names(), ST_BACKEND_DEVEMU);
}

void st_backend_close(st_backend *b) {
  if (b && b->ops && b->ops->close) b->ops->close(b->ctx);
  if (b) memset(b, 0, sizeof *b);
}
