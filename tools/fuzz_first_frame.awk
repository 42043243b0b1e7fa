# Names where a sanitizer or libFuzzer report starts: the shared library of the first stack frame
# that is not the runtime's, or "sparsetrace" when that frame is our code. tools/fuzz.sh uses it to
# tell a fault inside a library a fuzzer feeds (libhdf5 reading a corrupt file) from ours. A leak
# report is not looked at (tools/fuzz.sh fails every leak) and prints nothing.
#
#   awk -f tools/fuzz_first_frame.awk build-fuzz/logs/trace.log
#
# Runtime frames, skipped: the sanitizers' and libFuzzer's own, libc's (a frame symbolised from
# glibc's sources names no .so: "in __memset_avx512_unaligned_erms string/../sysdeps/x86_64/..."),
# the allocator's entry points (libFuzzer's malloc limit reports the caller of malloc: a corrupt
# vlen length that libhdf5 allocates for is its fault), and a frame in the executable itself with
# no source line. Our code is built with -g, so each of its frames has one; an interceptor linked
# into the executable has none and is not always named __interceptor_: ASan's strdup prints as
# "#0 0x... in strdup (/path/fuzz_trace+0xdf9a5)". That last rule holds only when the report's
# stack was symbolised (some frame has a source line): without llvm-symbolizer no frame has one,
# and our code called back from a library would pass for the library.
/ERROR: (AddressSanitizer|libFuzzer)|runtime error:|ALARM:/ { on = 1; next }
on && /^ *#[0-9]+ 0x/ {
  frame[++n] = $0
  if ($0 ~ /\.(c|h|cc|cpp):[0-9]+/) symbolised = 1
  next
}
on && n > 0 { exit }   # the first stack ends at the first line that is not a frame

END {
  for (i = 1; i <= n; i++) {
    f = frame[i]
    if (f ~ /__sanitizer|__interceptor|__asan|__lsan|__ubsan|fuzzer::|libc\.so|sysdeps\/|csu\/|in _start|pthread_kill|in raise |in abort /) continue
    if (f ~ / in (malloc|calloc|realloc|free|operator new) /) continue
    if (match(f, /\/[^ ()]*\.so[.0-9]*/)) { print substr(f, RSTART, RLENGTH); exit }
    if (symbolised && f ~ /\([^ ()]*\+0x[0-9a-f]+\)/) continue
    print "sparsetrace"
    exit
  }
}
