/*
** cmd_import.c — `sparsetrace import`: other engines' tensor dumps as sparsetrace traces.
**
**   import show FILE.pt [--pickle]      what a torch.save file (or a bare pickle) holds, as JSON
**   import sglang-dumper DIR ...        an sglang dumper directory -> a trace (recorder/import/)
**   import hf DIR ...                   tools/export_hf.py's output -> a trace
**
** The readers and the importer are in recorder/import/; this file only parses the command line.
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "options.h"
#include "recorder/import/torchsave.h"

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

int st_cmd_import(int argc, char **argv) {
  const char *what = argc > 1 ? argv[1] : NULL;
  if (what && !strcmp(what, "show")) return cmd_show(argc - 1, argv + 1);
  if (what && (!strcmp(what, "-h") || !strcmp(what, "--help"))) {
    printf("usage: sparsetrace import show FILE.pt [--pickle]\n"
           "       sparsetrace import sglang-dumper DIR --model DIR --out TRACE.h5 [--store DIR] [--map FILE]\n"
           "       sparsetrace import hf DIR --model DIR --out TRACE.h5 [--store DIR] [--map FILE]\n");
    return ST_EXIT_OK;
  }
  fprintf(stderr, "sparsetrace import: expected show, sglang-dumper or hf (sparsetrace import --help)\n");
  return ST_EXIT_USAGE;
}
