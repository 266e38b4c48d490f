/* LD_PRELOAD shim for tests: fwrite and pwrite (HDF5's) go out in 64 KiB
 * pieces with a 2 ms pause after each, as on a slow disk.
 * With NANSCOPE_TEST_WRITING_MARK=PATH set, a write into a file named
 * NAME.part while NAME already exists (a checkpoint replacing the one before
 * it) creates PATH after its first piece and then waits there: a test that
 * kills the process once PATH exists kills it mid-write, every time, however
 * busy the machine. Test-only. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static void pause_a_while(long nanoseconds) {
  const struct timespec pause = {0, nanoseconds};
  nanosleep(&pause, NULL);
}

/* Whether fd is NAME.part and NAME exists. */
static int replacing_a_file(int fd) {
  char link[64], path[4096];
  snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
  const ssize_t n = readlink(link, path, sizeof path - 1);
  if (n <= 5) return 0;
  path[n] = '\0';
  if (strcmp(path + n - 5, ".part") != 0) return 0;
  path[n - 5] = '\0';
  return access(path, F_OK) == 0;
}

/* Marks the moment and waits to be killed (a test's kill ends the wait). */
static void mark_mid_write(int fd) {
  const char* mark = getenv("NANSCOPE_TEST_WRITING_MARK");
  if (!mark || !replacing_a_file(fd)) return;
  const int made = open(mark, O_CREAT | O_WRONLY, 0644);
  if (made >= 0) close(made);
  for (;;) pause_a_while(100000000);
}

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
    mark_mid_write(fileno(stream));
    pause_a_while(2000000);
  }
  return size ? done / size : 0;
}

typedef ssize_t (*pwrite_fn)(int, const void*, size_t, off_t);

static ssize_t slow_pwrite(pwrite_fn real_pwrite, int fd, const void* data, size_t count, off_t offset) {
  const char* bytes = (const char*)data;
  size_t done = 0;
  while (done < count) {
    const size_t piece = count - done < 65536 ? count - done : 65536;
    const ssize_t written = real_pwrite(fd, bytes + done, piece, offset + (off_t)done);
    if (written <= 0) return done ? (ssize_t)done : written;
    done += (size_t)written;
    mark_mid_write(fd);
    pause_a_while(2000000);
  }
  return (ssize_t)done;
}

ssize_t pwrite(int fd, const void* data, size_t count, off_t offset) {
  static pwrite_fn real_pwrite;
  if (!real_pwrite) real_pwrite = (pwrite_fn)dlsym(RTLD_NEXT, "pwrite");
  return slow_pwrite(real_pwrite, fd, data, count, offset);
}

/* An HDF5 built with large-file offsets (Debian's 1.14) calls this name. */
ssize_t pwrite64(int fd, const void* data, size_t count, off_t offset) {
  static pwrite_fn real_pwrite64;
  if (!real_pwrite64) real_pwrite64 = (pwrite_fn)dlsym(RTLD_NEXT, "pwrite64");
  return slow_pwrite(real_pwrite64, fd, data, count, offset);
}
