/* LD_PRELOAD shim for tests: fwrite goes out in 64 KiB pieces with a 2 ms
 * pause after each, as on a slow disk, so that a process killed at a random
 * moment is often killed while a file is half written. Test-only. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <time.h>

size_t fwrite(const void* data, size_t size, size_t count, FILE* stream) {
  static size_t (*real_fwrite)(const void*, size_t, size_t, FILE*);
  if (!real_fwrite) real_fwrite = (size_t(*)(const void*, size_t, size_t, FILE*))dlsym(RTLD_NEXT, "fwrite");
  const size_t total = size * count;
  const char* bytes = (const char*)data;
  size_t done = 0;
  while (done < total) {
    const size_t piece = total - done < 65536 ? total - done : 65536;
    const size_t written = real_fwrite(bytes + done, 1, piece, stream);
    done += written;
    if (written < piece) break;
    fflush(stream);
    const struct timespec pause = {0, 2000000};
    nanosleep(&pause, NULL);
  }
  return size ? done / size : 0;
}
