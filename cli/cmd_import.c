/*
** cmd_import.c — `sparsetrace import`: other engines' tensor dumps as sparsetrace traces.
**
**   import show FILE.pt [--pickle]      what a torch.save file (or a bare pickle) holds, as JSON
**   import sglang-dumper DIR ...        an sglang dumper directory -> a trace (recorder/import/)
**   import hf DIR ...                   tools/export_hf.py's output -> a trace
**   import sglang-pass DIR ...          sglang's --debug-tensor-dump-output-folder -> a trace
**   import ds4 PREFIX|DIR ...           antirez/ds4's raw graph dumps -> a trace
**
** The readers and the importer are in recorder/import/; this file only parses the command line.
*/
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "options.h"
#include "recorder/import/import.h"
#include "recorder/import/torchsave.h"
#include "recorder/recorder.h"

static const st_opt_use show_options[] = {
  {ST_OPT_PICKLE, NULL, NULL},
  {0}};

static const st_cmd_spec show_spec = {
  "import show", "sparsetrace import show FILE.pt [--pickle]\n",
  "Prints what a torch.save file holds as one line of JSON, read by sparsetrace's own reader\n"
  "(nothing in the file is executed): dicts as {\"dict\": [[key, value], ...]}, tuples as\n"
  "{\"tuple\": [...]}, floats as {\"float\": \"%.17g\"}, tensors with dtype, shape, strides,\n"
  "storage offset and their row-major bytes in hex.\n",
  show_options, "Exit status: 0 shown, 1 unreadable (the message says where), 2 usage error.\n"};

static int cmd_show(int argc, char **argv) {
  st_opts o;
  st_opts_init(&o, &show_spec, argc, argv);
  const char *path = NULL;
  int pickle = 0, id, rc = ST_EXIT_OK;
  while ((id = st_opts_next(&o)) != ST_OPTS_DONE) {
    if (id == ST_OPTS_EXIT) { rc = o.exit_code; goto out; }
    if (id == ST_OPT_PICKLE) pickle = 1;
    else if (id == ST_OPT_POSITIONAL && !path) path = o.arg;
    else { rc = st_opts_error(&o, "unexpected argument '%s'", o.arg); goto out; }
  }
  if (!path) { rc = st_opts_error(&o, "which file? (sparsetrace import show FILE.pt)"); goto out; }
  st_torchsave *ts = NULL;
  st_status s;
  if (pickle) {
    char *data = NULL;
    size_t size = 0;
    FILE *f = fopen(path, "rb");
    if (!f) s = st_fail(ST_EIO, "open %s", path);
    else {
      s = ST_OK;
      size_t cap = 0;
      for (;;) {
        if (size == cap) {
          char *grown = cap < ((size_t)1 << 30) ? realloc(data, cap = cap ? cap * 2 : 65536) : NULL;
          if (!grown) { s = st_fail(ST_ETOOBIG, "%s: too large for a pickle", path); break; }
          data = grown;
        }
        size_t got = fread(data + size, 1, cap - size, f);
        size += got;
        if (!got) break;
      }
      fclose(f);
      if (!s) s = st_pickle_parse(path, (const uint8_t *)data, size, &ts);
      free(data);
    }
  } else {
    s = st_torchsave_open(path, &ts);
  }
  if (!s) s = st_py_write_json(ts, st_torchsave_root(ts), stdout);
  st_torchsave_close(ts);
  if (s) rc = st_cli_report_error("import show");
out:
  st_opts_free(&o);
  return rc;
}

static const st_opt_use dump_options[] = {
  {ST_OPT_MODEL, NULL, "the checkpoint the engine ran (its config.json gives layers and shapes)"},
  {ST_OPT_OUT, "TRACE.h5", "the trace to write (default STORE/runs/<run id>.h5)"},
  {ST_OPT_STORE, NULL, NULL},
  {ST_OPT_MAP, NULL, "a mapping table replacing the format's own (schemas/import/FORMAT.map:\n"
                     "NAME TAP LAYOUT [ALIGN] per line)"},
  {ST_OPT_REQUEST, "N", "which request of a multi-request step (default 0: the first)"},
  {ST_OPT_PROMPT_TOKENS, NULL, "ds4: the token ids the run processed, prompt then generated (its\n"
                               "dumps hold none)"},
  {ST_OPT_FORCE, NULL, "overwrite an existing trace file and its index row"},
  {ST_OPT_JSON, NULL, "print the result as one JSON object"},
  {0}};

static int cmd_dump(const char *format, int argc, char **argv) {
  char usage[256], name[64];
  snprintf(usage, sizeof usage, "sparsetrace import %s DIR --model DIR [--out TRACE.h5] [--store DIR] [--map FILE]\n", format);
  snprintf(name, sizeof name, "import %s", format);
  st_cmd_spec spec = {
    name, usage,
    "Reads a directory of torch.save tensor dumps in the sglang dumper's naming (sglang-dumper:\n"
    "DUMPER_DIR of sglang; hf: tools/export_hf.py's output for transformers), sglang's Pass*.pt\n"
    "dicts (sglang-pass: --debug-tensor-dump-output-folder), or antirez/ds4's raw\n"
    "dumps (ds4: the DS4_METAL_GRAPH_DUMP_PREFIX path or its directory; --prompt-tokens needed),\n"
    "maps each tensor to\n"
    "its tap with the format's table (schemas/import/FORMAT.map), aligns it to the reference\n"
    "engine's layout (batch and flat multi-request axes, steps stitched by position, top-k as\n"
    "sorted sets, element types) and writes a trace indexed like any run: inspect, diff, query,\n"
    "replay and bisect read it. What could not be aligned is noted per tap (inspect shows it).\n",
    dump_options, "Exit status: 0 imported, 1 error (the message names the file and tensor), 2 usage error.\n"};
  st_opts o;
  st_opts_init(&o, &spec, argc, argv);
  st_import_options opt = {.format = format, .request = 0};
  const char *out = NULL, *tokens_path = NULL;
  char *command_line = NULL;
  int32_t *tokens = NULL;
  int id, rc = ST_EXIT_OK;
  while ((id = st_opts_next(&o)) != ST_OPTS_DONE) {
    if (id == ST_OPTS_EXIT) { rc = o.exit_code; goto done; }
    int64_t v;
    switch (id) {
    case ST_OPT_POSITIONAL:
      if (opt.source_dir) { rc = st_opts_error(&o, "unexpected argument '%s'", o.arg); goto done; }
      opt.source_dir = o.arg;
      break;
    case ST_OPT_OUT: case ST_OPT_TRACE: out = o.arg; break;
    case ST_OPT_MAP: opt.map_path = o.arg; break;
    case ST_OPT_PROMPT_TOKENS: tokens_path = o.arg; break;
    case ST_OPT_FORCE: opt.force = 1; break;
    case ST_OPT_REQUEST:
      if (st_opt_int("request", o.arg, 0, 1 << 20, &v)) { rc = st_opts_fail(&o); goto done; }
      opt.request = (int)v;
      break;
    default: rc = st_opts_error(&o, "unexpected option"); goto done;
    }
  }
  if (!opt.source_dir) { rc = st_opts_error(&o, "which dump directory? (%s)", usage); goto done; }
  if (!o.model) { rc = st_opts_error(&o, "--model DIR is needed (the checkpoint the engine ran)"); goto done; }
  opt.model_dir = o.model;
  if (!strcmp(format, "ds4") && !tokens_path) {
    rc = st_opts_error(&o, "--prompt-tokens FILE is needed: ds4's dumps hold no token ids");
    goto done;
  }
  if (tokens_path) {
    int n = 0;
    if (st_cli_read_token_ids(tokens_path, &tokens, &n)) { rc = st_cli_report_error(name); goto done; }
    opt.tokens = tokens;
    opt.n_tokens = n;
  }
  opt.store_dir = o.store ? o.store : ST_DEFAULT_STORE;
  char path[4096];
  st_import_result res;
  command_line = st_cli_join_args("sparsetrace import", argc, argv);
  opt.command_line = command_line;
  if (!out) {
    /* default: STORE/runs/import-FORMAT-<the dump directory's name>.h5 */
    char copy[4096];
    int fits = snprintf(copy, sizeof copy, "%s", opt.source_dir) < (int)sizeof copy;
    size_t n = strlen(copy);
    while (n > 1 && copy[n - 1] == '/') copy[--n] = 0;
    const char *base = strrchr(copy, '/') ? strrchr(copy, '/') + 1 : copy;
    if (!fits || snprintf(path, sizeof path, "%s/runs/import-%s-%s.h5", opt.store_dir, format, base) >=
                     (int)sizeof path) {
      st_fail(ST_EINVAL, "the default trace path (%.60s.../runs/import-%s-<dump directory>.h5) is longer "
              "than %zu bytes: name the trace with --out", opt.store_dir, format, sizeof path - 1);
      rc = st_cli_report_error(name);
      goto done;
    }
    out = path;
  }
  opt.out_path = out;
  if (st_import_run(&opt, &res)) { rc = st_cli_report_error(name); goto done; }
  if (o.json) { /* built with jansson, like every --json: the trace path is the user's */
    json_t *j = json_pack("{s:s, s:s, s:i, s:i, s:i, s:i, s:i, s:I}", "run_id", res.run_id, "trace", out,
                          "files", res.n_files, "mapped", res.n_mapped, "unmapped", res.n_unmapped,
                          "taps", res.n_taps, "notes", res.n_notes, "tokens", (json_int_t)res.n_tokens);
    char *text = j ? json_dumps(j, JSON_PRESERVE_ORDER) : NULL;
    json_decref(j);
    if (!text) {
      st_fail(ST_EINVAL, "--json: no JSON line for trace %s (out of memory, or the path is not UTF-8)", out);
      rc = st_cli_report_error(name);
      goto done;
    }
    printf("%s\n", text);
    free(text);
  } else
    printf("imported %s: %d files (%d mapped, %d not in the map), %d taps, %lld tokens, %d alignment notes\n"
           "run %s\ntrace: %s\nindex: %s/index.sqlite\n", opt.source_dir, res.n_files, res.n_mapped,
           res.n_unmapped, res.n_taps, res.n_tokens, res.n_notes, res.run_id, out, opt.store_dir);
done:
  free(tokens);
  free(command_line);
  st_opts_free(&o);
  return rc;
}

int st_cmd_import(int argc, char **argv) {
  const char *what = argc > 1 ? argv[1] : NULL;
  if (what && !strcmp(what, "show")) return cmd_show(argc - 1, argv + 1);
  if (what && (!strcmp(what, "sglang-dumper") || !strcmp(what, "sglang-pass") || !strcmp(what, "hf") ||
               !strcmp(what, "ds4")))
    return cmd_dump(what, argc - 1, argv + 1);
  if (what && (!strcmp(what, "-h") || !strcmp(what, "--help"))) {
    printf("usage: sparsetrace import show FILE.pt [--pickle]\n"
           "       sparsetrace import sglang-dumper DIR --model DIR --out TRACE.h5 [--store DIR] [--map FILE]\n"
           "       sparsetrace import sglang-pass DIR --model DIR --out TRACE.h5 [--store DIR] [--map FILE]\n"
           "       sparsetrace import hf DIR --model DIR --out TRACE.h5 [--store DIR] [--map FILE]\n"
           "       sparsetrace import ds4 PREFIX|DIR --model DIR --prompt-tokens FILE --out TRACE.h5 [--store DIR] [--map FILE]\n");
    return ST_EXIT_OK;
  }
  fprintf(stderr, "sparsetrace import: expected show, sglang-dumper, sglang-pass, hf or ds4 (sparsetrace import --help)\n");
  return ST_EXIT_USAGE;
}
