/*
** commands.h — the sparsetrace subcommands. Each takes the arguments after its own name
** (argv[0] is the subcommand name), parses it with cli/options.h (one convention, one --help
** format), and returns the process exit code: 0 success, 1 failure (message on stderr, from
** st_errmsg()), 2 usage error.
*/
#ifndef ST_COMMANDS_H
#define ST_COMMANDS_H

#include <stdint.h>

#include "common/base.h"

int st_cmd_run(int argc, char **argv);      /* cli/cmd_run.c */
int st_cmd_taps(int argc, char **argv);     /* cli/cmd_catalogue.c */
int st_cmd_settings(int argc, char **argv); /* cli/cmd_catalogue.c */
int st_cmd_query(int argc, char **argv);    /* cli/cmd_query.c */
int st_cmd_inspect(int argc, char **argv);  /* cli/cmd_inspect.c */
int st_cmd_capture(int argc, char **argv);  /* cli/cmd_capture.c */
int st_cmd_serve(int argc, char **argv);    /* cli/cmd_serve.c */
int st_cmd_requests(int argc, char **argv); /* cli/cmd_requests.c */
int st_cmd_tokenize(int argc, char **argv); /* cli/cmd_tokenize.c */
int st_cmd_render(int argc, char **argv);   /* cli/cmd_render.c */
int st_cmd_diff(int argc, char **argv);     /* cli/cmd_diff.c: exit 0 same, 1 diverges, 2 error */
int st_cmd_replay(int argc, char **argv);   /* cli/cmd_replay.c */
int st_cmd_bisect(int argc, char **argv);   /* cli/cmd_bisect.c */
int st_cmd_report(int argc, char **argv);   /* cli/cmd_report.c: the HTML page (report/) */
int st_cmd_needle(int argc, char **argv);   /* cli/cmd_needle.c: make, sweep */
int st_cmd_scoreboard(int argc, char **argv); /* cli/cmd_scoreboard.c */
int st_cmd_store(int argc, char **argv);    /* cli/cmd_store.c: check [--repair]; 1 = problems */
int st_cmd_import(int argc, char **argv);   /* cli/cmd_import.c: show, sglang-dumper, hf */

/* Shared by subcommands: "prefix argv[0] ... argv[argc-1]" for provenance (caller frees; NULL
** when out of memory). */
char *st_cli_join_args(const char *prefix, int argc, char **argv);
/* Reads a JSON array of token ids ('-': stdin) into *out (malloc'd). Errors name the file, line
** and column, or the element that is no token id. (cmd_run.c) */
st_status st_cli_read_token_ids(const char *path, int32_t **out, int *n_out);

/* Shared by subcommands: prints "sparsetrace <cmd>: <st_errmsg()>" to stderr, returns 1. */
int st_cli_report_error(const char *cmd);

/* Shared by tokenize and render: --model DIR (tokenizer.json + optional tokenizer_config.json)
** or the path of a tokenizer.json file. Returns an st_status. cli/cmd_tokenize.c. */
struct st_tokenizer;
int st_cli_open_tokenizer(const char *model, struct st_tokenizer **tok);

#endif
