/* LD_PRELOAD shim for tests: fwrite and pwrite (HDF5's) go out in 64 KiB
 * pieces with a 2 ms pause after each, as on a slow disk, so that a process
 * killed at a random moment is often killed while a file is half written.
 * Test-only. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

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

ssize_t pwrite(int fd, const void* data, size_t count, off_t offset) {
  static ssize_t (*real_pwrite)(int, const void*, size_t, off_t);
  if (!real_pwrite) real_pwrite = (ssize_t(*)(int, const void*, size_t, off_t))dlsym(RTLD_NEXT, "pwrite");
  const char* bytes = (const char*)data;
  size_t done = 0;
  while (done < count) {
    const size_t piece = count - done < 65536 ? count - done : 65536;
    const ssize_t written = real_pwrite(fd, bytes + done, piece, offset + (off_t)done);
    if (written <= 0) return done ? (ssize_t)done : written;
    done += (size_t)written;
    const struct timespec pause = {0, 2000000};
    nanosleep(&pause, NULL);
  }
  return (ssize_t)done;
}
