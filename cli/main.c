/*
** main.c — the sparsetrace command line: dispatches argv[1] to a subcommand.
*/
#include <dlfcn.h>
#include <errno.h>
#include <execinfo.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "common/build_info.h"
#include "common/base.h"

typedef struct command {
  const char *name;
  int (*run)(int argc, char **argv);
  const char *summary;
} command;

static const command commands[] = {
  {"run", st_cmd_run, "run the reference engine on a prompt with taps armed, record a trace"},
  {"query", st_cmd_query, "read-only SQL over the trace store's index"},
  {"inspect", st_cmd_inspect, "show what a trace holds: taps, shapes, settings, build"},
  {"diff", st_cmd_diff, "compare two traces tap by tap; report the first divergence"},
  {"replay", st_cmd_replay, "re-execute one layer of a trace under alternate settings, sweep them"},
  {"bisect", st_cmd_bisect, "find the setting change and the first layer that lose the needle"},
  {"report", st_cmd_report, "one self-contained HTML page of runs, their diff, sweeps, a bisect"},
  {"needle", st_cmd_needle, "make needle-recall requests; sweep them against the engine or a server"},
  {"scoreboard", st_cmd_scoreboard, "one fixed needle corpus against several targets: matrix, fixed / broken"},
  {"capture", st_cmd_capture, "proxy between a client and its server, recording every request"},
  {"serve", st_cmd_serve, "the reference engine behind OpenAI and Anthropic endpoints, traced"},
  {"requests", st_cmd_requests, "list, show and export captured requests"},
  {"import", st_cmd_import, "turn another engine's tensor dumps (sglang, transformers) into a trace"},
  {"store", st_cmd_store, "check a trace store's index against its files (--repair fixes it)"},
  {"tokenize", st_cmd_tokenize, "text to token ids and back with a model's tokenizer.json"},
  {"render", st_cmd_render, "a chat request as the DeepSeek-V4 prompt (or its ids) an engine builds"},
  {"taps", st_cmd_taps, "list the tap catalogue"},
  {"settings", st_cmd_settings, "list the settings catalogue"},
};

static void usage(FILE *f) {
  fprintf(f, "usage: sparsetrace <command> [options]   (sparsetrace <command> --help)\n\n"
             "Record-and-replay debugging for sparse-attention inference (DeepSeek-V4).\n\n"
             "commands:\n");
  for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
    fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].summary);
}

char *st_cli_join_args(const char *prefix, int argc, char **argv) {
  size_t len = strlen(prefix) + 1;
  for (int i = 0; i < argc; i++) len += strlen(argv[i]) + 1;
  char *s = malloc(len);
  if (!s) return NULL;
  strcpy(s, prefix);
  for (int i = 0; i < argc; i++) strcat(strcat(s, " "), argv[i]);
  return s;
}

int st_cli_report_error(const char *cmd) {
  fprintf(stderr, "sparsetrace %s: %s\n", cmd, st_errmsg());
  return 1;
}

/* glibc loads libgcc_s (the unwinder) the first time a thread calls pthread_exit, and aborts the
** process ("libgcc_s.so.1 must be installed for pthread_exit to work") when that load fails.
** OpenMP's pool threads end through pthread_exit when a thread that ran parallel regions ends
** (serve's worker, at a clean stop): memory running out at that moment killed serve with SIGABRT
** while its store was still committing. The unwinder is loaded here, at the start, for good:
** opened by name (a failure is an error said now, not an abort later), then taken by glibc
** through backtrace(), which shares pthread_exit's loader and, unlike it, returns when it fails
** (no frame) instead of aborting. */
static int load_thread_exit_unwinder(void) {
#ifdef __GLIBC__
  errno = 0;
  if (!dlopen("libgcc_s.so.1", RTLD_NOW | RTLD_NODELETE)) {
    int err = errno; /* dlerror() says what failed, errno why ("cannot create shared object
                     ** descriptor" is the loader's malloc failing) */
    const char *what = dlerror(), *why = err ? strerror(err) : NULL;
    if (what && why && strstr(what, why)) why = NULL; /* said already */
    fprintf(stderr, "sparsetrace: loading libgcc_s.so.1, which ending a thread needs: %s%s%s%s\n",
            what ? what : "failed", why ? " (" : "", why ? why : "", why ? ")" : "");
    return -1;
  }
  void *frame[1];
  if (backtrace(frame, 1) < 1) {
    fprintf(stderr, "sparsetrace: loading libgcc_s.so.1, which ending a thread needs: the C "
                    "library could not take it (out of memory?)\n");
    return -1;
  }
#endif
  return 0;
}

int main(int argc, char **argv) {
  if (load_thread_exit_unwinder()) return 1;
  if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
    usage(argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  if (!strcmp(argv[1], "--version")) {
    printf("sparsetrace %s (%s, %s; sources %s)\n", st_build_revision, st_build_compiler, st_build_type,
           st_build_sources);
    return 0;
  }
  for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
    if (!strcmp(argv[1], commands[i].name)) return commands[i].run(argc - 1, argv + 1);
  fprintf(stderr, "sparsetrace: unknown command '%s'\n\n", argv[1]);
  usage(stderr);
  return 2;
}
