/*
** needle_corpus.h — the fixed material the needle generator (needle_prompt.c) draws from: tool
** definitions with JSON schemas, system-prompt rules, and word lists for filler. Internal to
** engine/needle_*.c. Every list is written for this project; counts are exported beside them.
*/
#ifndef ST_NEEDLE_CORPUS_H
#define ST_NEEDLE_CORPUS_H

typedef struct st_nc_tool {
  const char *name;
  const char *description;
  const char *schema; /* JSON object text: the tool's input schema */
} st_nc_tool;

/* Tools. The first ST_NC_CORE_TOOLS are the ones a coding agent always has, in the order they
** are added as the budget allows; the rest follow in a seed-dependent order. */
#define ST_NC_CORE_TOOLS 6
extern const st_nc_tool st_nc_tools[];
extern const int st_nc_n_tools;

#define ST_NC_LIST(name) \
  extern const char *const name[]; \
  extern const int name##_n;

ST_NC_LIST(st_nc_intros)      /* opening paragraph of the system prompt */
ST_NC_LIST(st_nc_rules)       /* "- ..." rule lines */
ST_NC_LIST(st_nc_modules)     /* package / module names */
ST_NC_LIST(st_nc_verbs)       /* identifier verbs: load, parse, ... */
ST_NC_LIST(st_nc_nouns)       /* identifier nouns: invoice, batch, ... */
ST_NC_LIST(st_nc_adjs)        /* identifier adjectives: stale, pending, ... */
ST_NC_LIST(st_nc_types)       /* Python type names */
ST_NC_LIST(st_nc_errors)      /* exception class names */
ST_NC_LIST(st_nc_words)       /* project-name words */
ST_NC_LIST(st_nc_regions)     /* cloud region names */
ST_NC_LIST(st_nc_people)      /* commit authors */
ST_NC_LIST(st_nc_tasks)       /* user task openings, with %s for a module */
ST_NC_LIST(st_nc_questions)   /* final questions: %s = label (twice); families q0-q2 */
ST_NC_LIST(st_nc_questions_more) /* more final question families, q3.. (same arguments) */
ST_NC_LIST(st_nc_decoy_questions) /* the final question with decoys: the last line of the label (same arguments) */
ST_NC_LIST(st_nc_ask_openers) /* composed questions (training only): openers, may be empty */
ST_NC_LIST(st_nc_ask_what)    /* ... asks: %s = label in lower case, %s = one of st_nc_ask_wheres */
ST_NC_LIST(st_nc_ask_last)    /* ... asks with decoys: the most recent line (same arguments) */
ST_NC_LIST(st_nc_ask_wheres)  /* ... where the line was: " earlier", ... */
ST_NC_LIST(st_nc_ask_line)    /* ... the line wanted: %s = label */
ST_NC_LIST(st_nc_ask_line_last) /* ... the line wanted with decoys: the last one (%s = label) */
ST_NC_LIST(st_nc_ask_manners) /* ... " exactly", ... */
ST_NC_LIST(st_nc_ask_ends)    /* ... ".", ", nothing more.", ... */
ST_NC_LIST(st_nc_thoughts)    /* assistant lines before a tool call: %s = a path or pattern */
ST_NC_LIST(st_nc_summaries)   /* assistant summary: %s = function, %s = path */

#undef ST_NC_LIST

#endif
