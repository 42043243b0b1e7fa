/*
** fuzz_trace.c — recorder/trace_reader.c: an HDF5 trace from arbitrary bytes (written to a temp
** file and opened in process, complete or not: libhdf5's faults must reach the fuzzer, not a
** child). When it opens: attributes, tokens, every tap's first rows and positions (bounded),
** and a position lookup.
*/
#include <hdf5.h>

#include "recorder/trace_reader.h"
#include "fuzz_util.h"

/* libhdf5 1.10 leaks blocks of its own when opening a file, a dataset, a group or an attribute
** of a corrupt file fails (issue 14, item 12): nothing a caller can free. Suppressed by those
** functions only, which needs full malloc stacks (libhdf5 has no frame pointers). Every other
** leak fails, memory that a read hands back included (a vlen string not reclaimed), and the
** handles a trace holds are checked below: none may stay open after st_trace_close. */
const char *__asan_default_options(void) { return "fast_unwind_on_malloc=0"; }
const char *__lsan_default_suppressions(void) {
  return "leak:H5F_open\nleak:H5D_open\nleak:H5G_open\nleak:H5A__open_common\nleak:H5O_open\n";
}

static void no_open_handles(void) {
  if (H5Fget_obj_count(H5F_OBJ_ALL, H5F_OBJ_ALL) != 0) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *path = fuzz_path("trace", ".h5");
  fuzz_write(path, data, size);
  for (unsigned flags = 0; flags < 2; flags++) {
    st_trace *t = NULL;
    unsigned open_flags = ST_TRACE_OPEN_IN_PROCESS | (flags ? ST_TRACE_OPEN_INCOMPLETE : 0u);
    if (st_trace_open(path, open_flags, &t) != ST_OK) {
      no_open_handles();
      continue;
    }
    (void)st_trace_attr(t, "run_id");
    (void)st_trace_attr_int(t, "n_layers", -1);
    int64_t n_tokens = 0;
    (void)st_trace_tokens(t, &n_tokens);
    (void)st_trace_n_prompt(t);
    int n = st_trace_tap_count(t);
    for (int i = 0; i < n; i++) {
      const st_trace_tap *tap = st_trace_tap_at(t, i);
      if (st_trace_find_tap(t, tap->name) == NULL) abort();
      size_t row = st_trace_row_elements(tap);
      int64_t rows = tap->shape[0] < 2 ? tap->shape[0] : 2;
      if (rows > 0 && row > 0 && row <= (1u << 20)) {
        float *f = malloc((size_t)rows * row * sizeof *f);
        int32_t *q = malloc((size_t)rows * row * sizeof *q);
        if (!f || !q) abort();
        (void)st_trace_read_f32(t, tap, 0, rows, f);
        (void)st_trace_read_i32(t, tap, 0, rows, q);
        free(f);
        free(q);
      }
      if (tap->shape[0] > 0 && tap->shape[0] <= (1 << 20)) {
        int64_t *pos = malloc((size_t)tap->shape[0] * sizeof *pos);
        if (!pos) abort();
        (void)st_trace_read_positions(t, tap, pos);
        free(pos);
        int64_t r;
        (void)st_trace_find_position(t, tap, 0, &r);
      }
    }
    st_trace_close(t);
    no_open_handles();
  }
  unlink(path);
  return 0;
}
