/*
** fuzz_torchsave.c — recorder/import/torchsave.c on arbitrary bytes, twice: as a torch.save file
** (ZIP central directory, local headers, zip64 records, data.pkl, storages) and as a bare pickle
** (the stack machine alone). Whatever opens is walked with st_py_write_json, which reads every
** tensor's bytes (they must lie in the file) under its depth and object bounds.
*/
#include "recorder/import/torchsave.h"
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static FILE *sink;
  if (!sink && !(sink = fopen("/dev/null", "w"))) abort();
  const char *path = fuzz_path("torchsave", ".pt");
  fuzz_write(path, data, size);
  st_torchsave *ts = NULL;
  if (st_torchsave_open(path, &ts) == ST_OK) {
    if (!st_torchsave_root(ts)) abort(); /* an opened file always has its object */
    (void)st_py_write_json(ts, st_torchsave_root(ts), sink);
    (void)st_py_dict_get(st_torchsave_root(ts), "value");
  }
  st_torchsave_close(ts);
  unlink(path);
  ts = NULL;
  if (st_pickle_parse("fuzz.pkl", data, size, &ts) == ST_OK) (void)st_py_write_json(ts, st_torchsave_root(ts), sink);
  st_torchsave_close(ts);
  return 0;
}
