/*
** cmd_render.c — `sparsetrace render`: a captured chat request as the DeepSeek-V4 prompt.
** (Being written: engine/chat.c.)
*/
#include <stdio.h>

#include "commands.h"

int st_cmd_render(int argc, char **argv) {
  (void)argc, (void)argv;
  fputs("sparsetrace render: not implemented yet\n", stderr);
  return 1;
}
